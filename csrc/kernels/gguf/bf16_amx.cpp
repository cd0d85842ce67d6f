// The AMX prefill kernel of the GGUF matmul (bf16_amx.h).
//
// Per call (rows [n_begin, n_end) of W, all M rows of x), for each group of 32 rows of W:
//   1. decode the group's blocks into wbuf [K / 32 chunks][32 rows][32 k] bfloat16 (AVX-512: a
//      group of 32 weights is two zmm of float32 made by blocks.h's operations, then rounded), so
//      that each A tile below is 1 KiB in a row (a row-major [32][K] buffer read at a stride of 2K
//      bytes measured the same);
//   2. for each pair of 16-row blocks of x, the four products of {W rows 0..15, 16..31} x {block b,
//      b + 1}, K / 32 steps each:
//
//        tmm4, tmm5  A: W rows [16][32 k] of the chunk, from wbuf
//        tmm6, tmm7  B: x blocks b, b + 1 as [16 k-pairs][16 rows][2] (bf16_amx_prepare's layout)
//        tmm0..3     C: float32 [16 W rows][16 x rows], C_{2i + j} = A_i B_j
//
//   3. each C is transposed (16 x 16 in registers) into y's rows.
// W is the A operand, so it needs no interleave: its rows are read as decoded, and x (small next to
// W in a prefill: 168 rows against 1536 .. 8960 k) carries the pair layout B wants. Decoding runs
// once per weight and call, the tile products once per 16 x 16 x 32.
#include "kernels/gguf/bf16_amx.h"

#include "kernels/skinny_linear/packed_amx.h"

#if defined(__x86_64__) && defined(__linux__)
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/common/amx_tiles.h"
#include "kernels/gguf/blocks.h"

// The float steps of the decoding must be blocks.h's, each rounded: no contraction into FMAs.
#pragma GCC optimize("-ffp-contract=off")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,f16c")
#include <immintrin.h>

#include "kernels/common/bf16_avx512.h"
#include "kernels/gguf/bf16_tile_pairs.h"

namespace specdec::gguf {
namespace {

constexpr int kTile = 16;   // rows of a tile, and x rows per block
constexpr int kChunk = 32;  // k per tile product (64 bytes of bfloat16 per A row)


// 32 float32 (a GGUF weight group's dequantised values, or activations) -> bfloat16, rounded.
inline void store_group(uint16_t* out, __m512 lo, __m512 hi) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), round_bf16_avx512(lo));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16), round_bf16_avx512(hi));
}

inline __m512i bytes_u32(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline __m512 f32(__m512i v) { return _mm512_cvtepi32_ps(v); }

// One row of K weights -> bfloat16, group by group (blocks.h's dequantize_group, vectorised: the same
// products and sums in the same order, each rounded): group g's 32 values at out + g * step.
void decode_row(int32_t type, const uint8_t* row, int64_t K, uint16_t* out, int64_t step) {
  const __m512i nib = _mm512_set1_epi32(15);
  if (is_lanes(type)) {
    // Repacked for the Q8 kernel (blocks.h): back in the file's order first, a scalar step the
    // loaders avoid (they repack only where no AMX prefill reads the weight).
    static thread_local std::vector<uint8_t> file_order;
    file_order.resize(static_cast<size_t>(K / kQK_K * block_bytes(type)));
    blocks_from_lanes(type, row, static_cast<int64_t>(file_order.size()), file_order.data());
    decode_row(file_type(type), file_order.data(), K, out, step);
    return;
  }
  switch (type) {
    case 3: {  // Q4_1: d * q + m
      const auto* b = reinterpret_cast<const BlockQ4_1*>(row);
      for (int64_t g = 0; g < K / kQK; ++g, out += step) {
        const __m512 d = _mm512_set1_ps(half_to_float(b[g].d)), m = _mm512_set1_ps(half_to_float(b[g].m));
        const __m512i q = bytes_u32(b[g].qs);
        store_group(out, _mm512_add_ps(_mm512_mul_ps(d, f32(_mm512_and_si512(q, nib))), m),
                    _mm512_add_ps(_mm512_mul_ps(d, f32(_mm512_srli_epi32(q, 4))), m));
      }
      break;
    }
    case 6: {  // Q5_0: d * (q - 16), the fifth bit from qh
      const auto* b = reinterpret_cast<const BlockQ5_0*>(row);
      const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
      const __m512i lanes_hi = _mm512_add_epi32(lanes, _mm512_set1_epi32(16));
      const __m512i one = _mm512_set1_epi32(1), sixteen = _mm512_set1_epi32(16);
      for (int64_t g = 0; g < K / kQK; ++g, out += step) {
        uint32_t qh;
        std::memcpy(&qh, b[g].qh, 4);
        const __m512i h = _mm512_set1_epi32(static_cast<int>(qh));
        const __m512 d = _mm512_set1_ps(half_to_float(b[g].d));
        const __m512i q = bytes_u32(b[g].qs);
        const __m512i lo = _mm512_or_si512(_mm512_and_si512(q, nib),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(h, lanes), one), 4));
        const __m512i hi = _mm512_or_si512(_mm512_srli_epi32(q, 4),
                                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srlv_epi32(h, lanes_hi), one), 4));
        store_group(out, _mm512_mul_ps(d, f32(_mm512_sub_epi32(lo, sixteen))),
                    _mm512_mul_ps(d, f32(_mm512_sub_epi32(hi, sixteen))));
      }
      break;
    }
    case 8: {  // Q8_0: q * d
      const auto* b = reinterpret_cast<const BlockQ8_0*>(row);
      for (int64_t g = 0; g < K / kQK; ++g, out += step) {
        const __m512 d = _mm512_set1_ps(half_to_float(b[g].d));
        const __m512i lo = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[g].qs)));
        const __m512i hi = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[g].qs + 16)));
        store_group(out, _mm512_mul_ps(f32(lo), d), _mm512_mul_ps(f32(hi), d));
      }
      break;
    }
    case 12: {  // Q4_K: (d * sc_s) * q - (dmin * m_s)
      const auto* b = reinterpret_cast<const BlockQ4_K*>(row);
      for (int64_t i = 0; i < K / kQK_K; ++i) {
        const float d = half_to_float(b[i].d), dmin = half_to_float(b[i].dmin);
        for (int s = 0; s < 8; ++s, out += step) {
          int sc, m;
          q4k_scale_min(b[i].scales, s, sc, m);
          const __m512 ds = _mm512_set1_ps(d * static_cast<float>(sc));
          const __m512 dm = _mm512_set1_ps(-(dmin * static_cast<float>(m)));
          const uint8_t* q = b[i].qs + 32 * (s >> 1);
          const int shift = 4 * (s & 1);
          const __m512i lo = _mm512_and_si512(_mm512_srli_epi32(bytes_u32(q), shift), nib);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(bytes_u32(q + 16), shift), nib);
          store_group(out, _mm512_add_ps(_mm512_mul_ps(ds, f32(lo)), dm), _mm512_add_ps(_mm512_mul_ps(ds, f32(hi)), dm));
        }
      }
      break;
    }
    default: {  // Q6_K: (d * sc_s) * (q - 32), 16 weights per scale
      const auto* b = reinterpret_cast<const BlockQ6_K*>(row);
      const __m512i three = _mm512_set1_epi32(3), bias = _mm512_set1_epi32(32);
      for (int64_t i = 0; i < K / kQK_K; ++i) {
        const float d = half_to_float(b[i].d);
        for (int g = 0; g < 8; ++g, out += step) {
          const int h = g >> 2, j = g & 3;
          const uint8_t* ql = b[i].ql + 64 * h + 32 * (j & 1);
          const uint8_t* qh = b[i].qh + 32 * h;
          const int lshift = 4 * (j >> 1), hshift = 2 * j;
          __m512 v[2];
          for (int half = 0; half < 2; ++half) {
            const __m512i low = _mm512_and_si512(_mm512_srli_epi32(bytes_u32(ql + 16 * half), lshift), nib);
            const __m512i high = _mm512_and_si512(_mm512_srli_epi32(bytes_u32(qh + 16 * half), hshift), three);
            const __m512i code = _mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32(high, 4)), bias);
            const float ds = d * static_cast<float>(b[i].scales[2 * g + half]);
            v[half] = _mm512_mul_ps(_mm512_set1_ps(ds), f32(code));
          }
          store_group(out, v[0], v[1]);
        }
      }
      break;
    }
  }
}

// c [16][16] float32 (c[r][m]: output r of the W tile, x row m) -> y[m * ldy + r] for r < rows_w,
// m < rows_x: an in-register transpose, then one masked store per x row.
void store_transposed(const float* c, float* y, int64_t ldy, int rows_w, int rows_x) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(c + 16 * i);
  for (int i = 0; i < 16; i += 2) {  // pairs of rows, 32-bit interleave
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // per 128-bit lane L: r[i] is column 4L .. 4L + 3 of rows i .. i + 3
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int h = 0; h < 16; h += 8)  // lanes: t[h + j] = columns j, j + 8 (j < 4) or j + 4, j + 12 of rows h .. h + 7
    for (int j = 0; j < 4; ++j) {
      t[h + j] = _mm512_shuffle_f32x4(r[h + j], r[h + 4 + j], 0x88);
      t[h + 4 + j] = _mm512_shuffle_f32x4(r[h + j], r[h + 4 + j], 0xDD);
    }
  const __mmask16 mask = static_cast<__mmask16>((1u << rows_w) - 1u);
  for (int j = 0; j < 8; ++j) {  // column j from t[j] and t[8 + j] (0x88), column 8 + j (0xDD)
    if (j < rows_x) _mm512_mask_storeu_ps(y + j * ldy, mask, _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88));
    if (8 + j < rows_x) _mm512_mask_storeu_ps(y + (8 + j) * ldy, mask, _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD));
  }
}

}  // namespace

bool bf16_amx_enabled() { return skinny::packed_amx_enabled(); }

int64_t bf16_amx_rows_size(int64_t M, int64_t K) {
  const int64_t blocks = ((M + kTile - 1) / kTile + 1) / 2 * 2;
  return blocks * kTile * K;
}

void bf16_amx_prepare(const float* x, int64_t M, int64_t K, uint16_t* xv) {
  const int64_t blocks = ((M + kTile - 1) / kTile + 1) / 2 * 2, chunks = K / kChunk;
  const int64_t full = M / kTile;  // blocks with no missing row; the rest start zero
  std::memset(xv + full * kTile * K, 0, sizeof(uint16_t) * (blocks - full) * kTile * K);
  // A row's 32 values of a chunk, rounded, go to the 16 k-pairs' slots of that row (stride 16 pairs).
  alignas(64) uint16_t tmp[kChunk];
  for (int64_t m = 0; m < M; ++m) {
    const int64_t b = m / kTile, r = m % kTile;
    for (int64_t c = 0; c < chunks; ++c) {
      store_group(tmp, _mm512_loadu_ps(x + m * K + c * kChunk), _mm512_loadu_ps(x + m * K + c * kChunk + 16));
      uint32_t* dst = reinterpret_cast<uint32_t*>(xv + (b * chunks + c) * kTile * kChunk) + r;
      for (int p = 0; p < kTile; ++p) std::memcpy(dst + p * kTile, tmp + 2 * p, 4);
    }
  }
}

void matmul_bf16_amx_rows(int32_t type, const uint16_t* xv, int64_t M, int64_t K, const uint8_t* weight, float* y,
                          int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (M <= 0 || n_end <= n_begin) return;
  const int64_t chunks = K / kChunk, blocks = bf16_amx_rows_size(M, K) / (kTile * K);
  const int64_t row_bytes = K / block_weights(type) * block_bytes(type);
  constexpr int64_t kGroupTiles = 2 * kTile * kChunk;  // elements of one chunk's two A tiles
  static thread_local std::vector<uint16_t> wbuf;      // [chunks][32 W rows][32 k]
  wbuf.resize(chunks * kGroupTiles);
  alignas(64) float cbuf[4][kTile * kTile];
  const AmxTileConfig cfg = AmxTileConfig::full();  // every register 16 rows of 64 bytes
  _tile_loadconfig(&cfg);
  const int64_t x_block = chunks * kTile * kChunk;  // elements of one x block
  for (int64_t n0 = n_begin; n0 < n_end; n0 += 2 * kTile) {
    const int rows = static_cast<int>(std::min<int64_t>(2 * kTile, n_end - n0));
    for (int r = 0; r < rows; ++r)
      decode_row(type, weight + (n0 + r) * row_bytes, K, wbuf.data() + r * kChunk, kGroupTiles);
    for (int r = rows; r < 2 * kTile; ++r)
      for (int64_t c = 0; c < chunks; ++c) std::memset(wbuf.data() + c * kGroupTiles + r * kChunk, 0, 2 * kChunk);
    for (int64_t b = 0; b < blocks; b += 2) {
      const uint16_t* x0 = xv + b * x_block;
      tile_pair_products(wbuf.data(), wbuf.data() + kTile * kChunk, kGroupTiles, x0, x0 + x_block, kTile * kChunk,
                         chunks, cbuf);
      for (int t = 0; t < 4; ++t) {
        const int i = t / 2;                     // W rows 16 i ..
        const int64_t m0 = (b + t % 2) * kTile;  // x rows m0 ..
        const int rows_w = std::clamp(rows - kTile * i, 0, kTile);
        const int rows_x = static_cast<int>(std::clamp<int64_t>(M - m0, 0, kTile));
        if (rows_w > 0 && rows_x > 0) store_transposed(cbuf[t], y + m0 * ldy + n0 + kTile * i, ldy, rows_w, rows_x);
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
bool bf16_amx_enabled() { return false; }
int64_t bf16_amx_rows_size(int64_t, int64_t) { return 0; }
void bf16_amx_prepare(const float*, int64_t, int64_t, uint16_t*) {}
void matmul_bf16_amx_rows(int32_t, const uint16_t*, int64_t, int64_t, const uint8_t*, float*, int64_t, int64_t,
                          int64_t) {
  std::abort();  // callers check bf16_amx_enabled()
}
}  // namespace specdec::gguf
#endif
