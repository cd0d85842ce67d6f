// The AMX prefill kernel of the GGUF matmul over weights in panels of 16 rows (bf16_amx.h,
// panels.h): the same numbers as matmul_bf16_amx_rows on the file's blocks, bit for bit.
//
// Why a second tile kernel: on an AMX CPU the decoding kernels also want the panels (a one-token
// step of Qwen2.5-Coder-1.5B 55 -> 47 ms on a 2-core Sapphire Rapids-class Xeon), while the file
// order kernel decodes W one row at a time. A panel holds 16 rows' codes of a block column side by
// side, each 32-bit lane one row, so its values come out as vectors over 16 rows at one k: the
// layout of a B tile ([16 k-pairs][16 columns][2]) once two k's are interleaved. So here W is the B
// operand and x the A operand (bfloat16 rows, each 16-row block stored tile by tile), and C is [16
// x rows][16 W rows], y's own layout: no transpose on either side.
//
// Per call (rows [n_begin, n_end) of W, all M rows of x), for each pair of panel groups (32 rows):
//   1. decode both groups into wbuf [K / 32 chunks][2 groups][16 k-pairs][16 rows][2] bfloat16
//      (blocks.h's float steps, vectorised over rows, each rounded: the file-order kernel's values);
//   2. for each pair of 16-row blocks of x, K / 32 steps of
//        tmm4, tmm5  A: x blocks b, b + 1, [16 rows][32 k] of the chunk
//        tmm6, tmm7  B: W groups 0, 1 of the chunk
//        tmm0..3     C: float32 [16 x rows][16 W rows], C_{2i + j} = A_i B_j;
//   3. each C row is stored into y, masked to [n_begin, n_end).
// Each output is the hardware's float32 sum of the same products, k in the same order, as the file
// order kernel's (the operands' roles swapped: a w = w a, exactly), so its bits are the same.
#include "kernels/gguf/bf16_amx.h"

#if defined(__x86_64__) && defined(__linux__)
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/common/amx_tiles.h"
#include "kernels/gguf/blocks.h"
#include "kernels/gguf/panels.h"

// The decoding's float steps must be blocks.h's, each rounded: no contraction into FMAs.
#pragma GCC optimize("-ffp-contract=off")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,f16c")
#include <immintrin.h>

#include "kernels/common/bf16_avx512.h"
#include "kernels/gguf/bf16_tile_pairs.h"

namespace specdec::gguf {
namespace {

constexpr int kTile = 16;   // rows of a tile: x rows per block, W rows per panel group
constexpr int kChunk = 32;  // k per tile product

// float32 -> its bfloat16 (round_bf16_avx512's rounding, to nearest even) in the high half of each
// 32-bit lane, the low half left as it falls: the two values of a pair are then one blend apart.
inline __m512i round_bf16_high(__m512 f) {
  const __m512i b = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
}

// One B tile row: the values of k = 2p and 2p + 1 for 16 rows (v0, v1: float32, one lane per row)
// -> 16 lanes of (bf16(v0) | bf16(v1) << 16).
inline void store_pair(uint16_t* out, __m512 v0, __m512 v1) {
  const __m512i lo = _mm512_srli_epi32(round_bf16_high(v0), 16);
  _mm512_storeu_si512(out, _mm512_mask_blend_epi16(0xAAAAAAAAu, lo, round_bf16_high(v1)));
}

inline __m512i load(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline __m512 f32(__m512i v) { return _mm512_cvtepi32_ps(v); }
// Each lane (row) shifted right by `bit` and masked: a code or a byte at that bit.
inline __m512i field(__m512i v, int bit, int mask) {
  return _mm512_and_si512(_mm512_srli_epi32(v, bit), _mm512_set1_epi32(mask));
}
// 16 fp16 values, one per row, at `p` (2 bytes apart), or the low / high halves of 16 32-bit lanes.
inline __m512 halves16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline __m512 low_half(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }
inline __m512 high_half(__m512i v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(v, 16))); }

// Codes of k = 8 s + 4 h + b (h, b < 2, 4) within a 64-byte step of 4-bit codes: lane r, byte b,
// nibble h (panels.h: p[64 (k >> 3) + 4 r + (k & 3)] >> 4 ((k >> 2) & 1)).
inline __m512i nibble(__m512i step, int k) { return field(step, 8 * (k & 3) + 4 * ((k >> 2) & 1), 15); }

// Chunk c's B tile of a Q4_K panel group: (d * sc_s) * q - (dmin * m_s), s = c % 8.
void decode_q4k_chunk(const uint8_t* p, int s, uint16_t* out) {
  const __m512i w0 = load(p + 2048), w1 = load(p + 2112), w2 = load(p + 2176);  // scale bytes 0..3, 4..7, 8..11
  const __m512i dd = load(p + 2240);
  // q4k_scale_min over 16 rows: byte j of the 12 is byte j % 4 of w(j / 4).
  auto byte = [&](int j) { return field(j < 4 ? w0 : j < 8 ? w1 : w2, 8 * (j & 3), 255); };
  __m512i sc, m;
  if (s < 4) {
    sc = _mm512_and_si512(byte(s), _mm512_set1_epi32(63));
    m = _mm512_and_si512(byte(s + 4), _mm512_set1_epi32(63));
  } else {
    sc = _mm512_or_si512(_mm512_and_si512(byte(s + 4), _mm512_set1_epi32(15)),
                         _mm512_slli_epi32(_mm512_srli_epi32(byte(s - 4), 6), 4));
    m = _mm512_or_si512(_mm512_srli_epi32(byte(s + 4), 4), _mm512_slli_epi32(_mm512_srli_epi32(byte(s), 6), 4));
  }
  const __m512 ds = _mm512_mul_ps(low_half(dd), f32(sc));
  const __m512 dm = _mm512_xor_ps(_mm512_mul_ps(high_half(dd), f32(m)), _mm512_set1_ps(-0.0f));  // -(dmin m)
  for (int i = 0; i < 4; ++i) {  // k = 32 s + 8 i .. + 7: one 64-byte step
    const __m512i step = load(p + 64 * (4 * s + i));
    for (int q = 0; q < 4; ++q) {  // pairs (8 i + 2 q, + 1)
      const int k = 2 * q;
      store_pair(out + 32 * (4 * i + q), _mm512_add_ps(_mm512_mul_ps(ds, f32(nibble(step, k))), dm),
                 _mm512_add_ps(_mm512_mul_ps(ds, f32(nibble(step, k + 1))), dm));
    }
  }
}

// Chunk c's B tile of a Q6_K panel group: (d * sc) * (q - 32), sc per 16 k, g = c % 8.
void decode_q6k_chunk(const uint8_t* p, int g, uint16_t* out) {
  const __m512 d = halves16(p + 3328);
  const __m512i words = load(p + 3072 + 64 * (g >> 1));  // scales 4 (g >> 1) .. + 3 (int8)
  const __m512i bias = _mm512_set1_epi32(32);
  for (int half = 0; half < 2; ++half) {  // k = 32 g + 16 half .. + 15, scale 2 g + half
    const int j = 2 * (g & 1) + half;     // its byte within the word
    const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(words, 24 - 8 * j), 24);
    const __m512 ds = _mm512_mul_ps(d, f32(sc));
    const int k0 = 32 * g + 16 * half;
    const __m512i high = load(p + 2048 + 64 * (k0 >> 4));
    for (int i = 0; i < 2; ++i) {  // k0 + 8 i .. + 7
      const __m512i low = load(p + 64 * ((k0 >> 3) + i));
      for (int q = 0; q < 4; ++q) {
        __m512 v[2];
        for (int e = 0; e < 2; ++e) {
          const int k = k0 + 8 * i + 2 * q + e;
          const __m512i top = field(high, 8 * (k & 3) + 2 * ((k >> 2) & 3), 3);  // bits 4, 5 of the code
          const __m512i code = _mm512_or_si512(nibble(low, k), _mm512_slli_epi32(top, 4));
          v[e] = _mm512_mul_ps(ds, f32(_mm512_sub_epi32(code, bias)));
        }
        store_pair(out + 32 * (8 * half + 4 * i + q), v[0], v[1]);
      }
    }
  }
}

// A legacy panel (one block of 32 k for 16 rows) -> its B tile.
void decode_legacy_chunk(int32_t file, const uint8_t* p, uint16_t* out) {
  if (file == 8) {  // Q8_0: (code - 128) * d, code k at p[64 (k >> 2) + 4 r + (k & 3)]
    const __m512 d = halves16(p + 512);
    const __m512i bias = _mm512_set1_epi32(128);
    for (int s = 0; s < 8; ++s) {
      const __m512i step = load(p + 64 * s);
      for (int q = 0; q < 2; ++q)
        store_pair(out + 32 * (2 * s + q),
                   _mm512_mul_ps(f32(_mm512_sub_epi32(field(step, 16 * q, 255), bias)), d),
                   _mm512_mul_ps(f32(_mm512_sub_epi32(field(step, 16 * q + 8, 255), bias)), d));
    }
    return;
  }
  // At p + 256, Q4_1: d | m << 16 per lane; Q5_0: the fifth bits, bit k >> 2 of byte k & 3.
  const __m512i tail = load(p + 256);
  const __m512 d = file == 6 ? halves16(p + 320) : low_half(tail);
  const __m512 m = high_half(tail);
  const __m512i sixteen = _mm512_set1_epi32(16);
  for (int i = 0; i < 4; ++i) {
    const __m512i step = load(p + 64 * i);
    for (int q = 0; q < 4; ++q) {
      __m512 v[2];
      for (int e = 0; e < 2; ++e) {
        const int k = 8 * i + 2 * q + e;
        const __m512i low = nibble(step, k);
        if (file == 6) {
          const __m512i code = _mm512_or_si512(low, _mm512_slli_epi32(field(tail, 8 * (k & 3) + (k >> 2), 1), 4));
          v[e] = _mm512_mul_ps(d, f32(_mm512_sub_epi32(code, sixteen)));
        } else {
          v[e] = _mm512_add_ps(_mm512_mul_ps(d, f32(low)), m);
        }
      }
      store_pair(out + 32 * (4 * i + q), v[0], v[1]);
    }
  }
}

// A panel group (16 rows of K) -> chunk c's B tile at out + c * step, for every chunk.
void decode_group(int32_t file, const uint8_t* group, int64_t K, uint16_t* out, int64_t step) {
  const int64_t panel = kPanelRows * block_bytes(file);
  if (file == 12 || file == 14) {
    for (int64_t t = 0; t < K / kQK_K; ++t)
      for (int s = 0; s < 8; ++s) {
        uint16_t* tile = out + (8 * t + s) * step;
        if (file == 12) decode_q4k_chunk(group + t * panel, s, tile);
        else decode_q6k_chunk(group + t * panel, s, tile);
      }
    return;
  }
  for (int64_t c = 0; c < K / kQK; ++c) decode_legacy_chunk(file, group + c * panel, out + c * step);
}

}  // namespace

int64_t bf16_amx_panel_rows_size(int64_t M, int64_t K) { return bf16_amx_rows_size(M, K); }

void bf16_amx_prepare_panel_rows(const float* x, int64_t M, int64_t K, uint16_t* xr) {
  const int64_t chunks = K / kChunk, full = M / kTile, padded = bf16_amx_rows_size(M, K) / K;
  std::memset(xr + full * kTile * K, 0, sizeof(uint16_t) * (padded - full * kTile) * K);
  for (int64_t m = 0; m < M; ++m) {
    uint16_t* block = xr + (m / kTile) * kTile * K + (m % kTile) * kChunk;
    for (int64_t c = 0; c < chunks; ++c)
      for (int h = 0; h < 2; ++h)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(block + c * kTile * kChunk + 16 * h),
                            round_bf16_avx512(_mm512_loadu_ps(x + m * K + c * kChunk + 16 * h)));
  }
}

void matmul_bf16_amx_panel_rows(int32_t type, const uint16_t* xr, int64_t M, int64_t K, const uint8_t* weight, float* y,
                                int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (M <= 0 || n_end <= n_begin) return;
  const int32_t file = file_type(type);
  const int64_t chunks = K / kChunk, blocks = bf16_amx_rows_size(M, K) / (kTile * K);
  const int64_t group_bytes = kPanelRows * (K / block_weights(file) * block_bytes(file));
  constexpr int64_t kTileElems = kTile * kChunk;  // bfloat16 of one tile
  static thread_local std::vector<uint16_t> wbuf;  // [chunks][2 groups][16 k-pairs][16 rows][2]
  wbuf.resize(chunks * 2 * kTileElems);
  alignas(64) float cbuf[4][kTile * kTile];
  const AmxTileConfig cfg = AmxTileConfig::full();  // every register 16 rows of 64 bytes
  _tile_loadconfig(&cfg);
  for (int64_t n0 = n_begin / kPanelRows * kPanelRows; n0 < n_end; n0 += 2 * kTile) {
    const int groups = n0 + kTile < n_end ? 2 : 1;
    for (int g = 0; g < groups; ++g)
      decode_group(file, weight + (n0 / kPanelRows + g) * group_bytes, K, wbuf.data() + g * kTileElems,
                   2 * kTileElems);
    if (groups == 1)
      for (int64_t c = 0; c < chunks; ++c) std::memset(wbuf.data() + (2 * c + 1) * kTileElems, 0, 2 * kTileElems);
    for (int64_t b = 0; b < blocks; b += 2) {
      const uint16_t* x0 = xr + b * kTile * K;
      tile_pair_products(x0, x0 + kTile * K, kTileElems, wbuf.data(), wbuf.data() + kTileElems, 2 * kTileElems,
                         chunks, cbuf);
      for (int t = 0; t < 4; ++t) {
        const int64_t m0 = (b + t / 2) * kTile;          // x rows m0 ..
        const int64_t w0 = n0 + kTile * (t % 2);         // W rows w0 ..
        const int64_t lo = std::max(n_begin, w0), hi = std::min(n_end, w0 + kTile);
        if (lo >= hi || m0 >= M) continue;
        const __mmask16 mask = static_cast<__mmask16>(((1u << (hi - w0)) - 1u) & ~((1u << (lo - w0)) - 1u));
        for (int64_t i = 0; i < std::min<int64_t>(kTile, M - m0); ++i)
          _mm512_mask_storeu_ps(y + (m0 + i) * ldy + w0, mask, _mm512_loadu_ps(cbuf[t] + kTile * i));
      }
    }
  }
  _tile_release();
}

}  // namespace specdec::gguf
#pragma GCC pop_options

#else
#include <cstdlib>
namespace specdec::gguf {
int64_t bf16_amx_panel_rows_size(int64_t, int64_t) { return 0; }
void bf16_amx_prepare_panel_rows(const float*, int64_t, int64_t, uint16_t*) {}
void matmul_bf16_amx_panel_rows(int32_t, const uint16_t*, int64_t, int64_t, const uint8_t*, float*, int64_t, int64_t,
                                int64_t) {
  std::abort();  // callers check bf16_amx_enabled()
}
}  // namespace specdec::gguf
#endif
