// The AMX tier of the packed-panel skinny linear for bfloat16 panels (packed_amx.h).
//
// Tiles (8 registers of up to 16 rows x 64 bytes), for one panel of 64 outputs and a block of up
// to 16 activation rows (tokens):
//
//   tmm0..3  C: float32 [rows][16], outputs of group g = 0..3 of the panel (permuted, see below)
//   tmm4..6  A: the rows' hi / lo / lo2 bfloat16 parts, 32 k each ([rows][32], from a split copy)
//   tmm7     B: 32 k x 16 outputs in pairs (row kp = (W[n, 2kp], W[n, 2kp + 1]) for 16 n)
//
//   for each 32-k chunk of the panel:  stage B_0..3 from 32 panel k-rows (an interleave, in L1)
//                                      C_g += A_hi B_g; C_g += A_lo B_g; C_g += A_lo2 B_g   (g = 0..3)
//
// The panel stores k-row k as 64 consecutive bfloat16 outputs; B wants each output's k and k + 1
// side by side. vpunpck{l,h}wd of k-rows k and k + 1 do that within 128-bit lanes, so B_g's column
// c is not output 16g + c but a fixed permutation of the panel's outputs (out_index below), undone
// when C is written to y. One k-row pair costs 4 loads, 4 unpacks and 4 stores, so the weight
// stream stays the bound for 1 to 16 rows; more rows take further passes over the panel, from L2.
#include "kernels/skinny_linear/packed_amx.h"

#include <algorithm>
#include <cstring>

#include "kernels/common/amx_tiles.h"
#include "kernels/common/cpu_isa.h"
#include "kernels/skinny_linear/packed_cpu.h"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own undefined-vector idiom.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq")
#include <immintrin.h>

#include "kernels/common/bf16_avx512.h"

namespace specdec::skinny {
namespace {

constexpr int kRowsMax = 16;  // activation rows per tile (AMX: 16 rows of 64 bytes)
constexpr int kKChunk = 32;   // k per tile step: 64 bytes of bfloat16 per A row
constexpr int kGroups = kPanel / 16;
// Software prefetch distance in k-rows: one chunk (4 KiB) ahead. 128 and 256 measured slower on a
// 2-core Xeon (both threads streaming), the hardware prefetcher doing the rest.
constexpr int64_t kPrefetchRows = kKChunk;
static_assert(kPanel == 64, "four 16-output B tiles per panel");

using TileConfig = AmxTileConfig;

TileConfig config_for(int rows) {
  TileConfig c;
  for (int t = 0; t < 7; ++t) {  // C and A: `rows` rows of 64 bytes
    c.rows[t] = static_cast<uint8_t>(rows);
    c.colsb[t] = 64;
  }
  c.rows[7] = 16;  // B: 16 k-pairs of 16 outputs
  c.colsb[7] = 64;
  return c;
}

// Output (within the panel) held by column c of B_g: k-rows' 32-output halves h = g / 2, the
// unpack's low (g even) or high quarter of each 128-bit lane (8 outputs), 4 outputs per lane.
constexpr int out_index(int g, int c) { return 32 * (g / 2) + 8 * (c / 4) + 4 * (g % 2) + c % 4; }
static_assert(out_index(1, 0) == 4 && out_index(2, 5) == 41, "store_panel's permutes undo this order");

// x [rows][K] float32 -> [rows][Kp] bfloat16 bits rounded to nearest even (one part: a prefill's).
void round_rows(const float* x, int rows, int64_t K, int64_t Kp, uint16_t* out) {
  for (int m = 0; m < rows; ++m) {
    const float* xr = x + m * K;
    for (int64_t k = 0; k < Kp; k += 16) {
      const __mmask16 in = k + 16 <= K ? __mmask16(0xFFFF) : k < K ? __mmask16((1u << (K - k)) - 1u) : __mmask16(0);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * Kp + k),
                          round_bf16_avx512(_mm512_maskz_loadu_ps(in, xr + k)));
    }
  }
}

// x [rows][K] float32 -> parts [3][rows][Kp] bfloat16 bits (hi, lo, lo2; Kp = K rounded up to 32,
// zero past K). Each split is exact (packed_amx.h): clearing the low 16 bits truncates to a
// bfloat16 number, and the remainder of a float32 after its top 8 significant bits has at most 16.
void split_rows(const float* x, int rows, int64_t K, int64_t Kp, uint16_t* parts) {
  const __m512i top = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  uint16_t* hi = parts;
  uint16_t* lo = parts + rows * Kp;
  uint16_t* lo2 = parts + 2 * rows * Kp;
  for (int m = 0; m < rows; ++m) {
    const float* xr = x + m * K;
    for (int64_t k = 0; k < Kp; k += 16) {
      const __mmask16 in = k + 16 <= K ? __mmask16(0xFFFF) : k < K ? __mmask16((1u << (K - k)) - 1u) : __mmask16(0);
      const __m512 v = _mm512_maskz_loadu_ps(in, xr + k);
      const __m512i h = _mm512_and_si512(_mm512_castps_si512(v), top);
      const __m512 r1 = _mm512_sub_ps(v, _mm512_castsi512_ps(h));
      const __m512i l = _mm512_and_si512(_mm512_castps_si512(r1), top);
      const __m512 r2 = _mm512_sub_ps(r1, _mm512_castsi512_ps(l));
      const __m512i l2 = _mm512_and_si512(_mm512_castps_si512(r2), top);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + m * Kp + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + m * Kp + k), _mm512_cvtepi32_epi16(_mm512_srli_epi32(l, 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo2 + m * Kp + k),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(l2, 16)));
    }
  }
}

// B_0..3 of k-rows [k0, k0 + 32) of a panel into stage [4][16][32] bfloat16 (1 KiB each), k-rows
// at or past K as zeros. Prefetches the next chunk (the rest of this panel, or the next panel,
// which follows it in memory).
inline void stage_chunk(const uint16_t* panel, int64_t K, int64_t k0, uint16_t* stage, bool prefetch) {
  for (int kp = 0; kp < kKChunk / 2; ++kp) {
    const int64_t k = k0 + 2 * kp;
    const uint16_t* ra = panel + k * kPanel;
    if (prefetch) {
      const char* ahead = reinterpret_cast<const char*>(ra + kPrefetchRows * kPanel);
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
      _mm_prefetch(ahead + 128, _MM_HINT_T0);
      _mm_prefetch(ahead + 192, _MM_HINT_T0);
    }
    __m512i a0, a1, b0, b1;
    if (k + 1 < K) {
      a0 = _mm512_loadu_si512(ra);
      a1 = _mm512_loadu_si512(ra + 32);
      b0 = _mm512_loadu_si512(ra + kPanel);
      b1 = _mm512_loadu_si512(ra + kPanel + 32);
    } else {
      const bool have_a = k < K;
      a0 = have_a ? _mm512_loadu_si512(ra) : _mm512_setzero_si512();
      a1 = have_a ? _mm512_loadu_si512(ra + 32) : _mm512_setzero_si512();
      b0 = b1 = _mm512_setzero_si512();
    }
    _mm512_storeu_si512(stage + 0 * 512 + kp * 32, _mm512_unpacklo_epi16(a0, b0));
    _mm512_storeu_si512(stage + 1 * 512 + kp * 32, _mm512_unpackhi_epi16(a0, b0));
    _mm512_storeu_si512(stage + 2 * 512 + kp * 32, _mm512_unpacklo_epi16(a1, b1));
    _mm512_storeu_si512(stage + 3 * 512 + kp * 32, _mm512_unpackhi_epi16(a1, b1));
  }
}

// One panel against `rows` activation rows whose parts are at `parts` (split_rows, or round_rows
// for kParts 1); the tile
// configuration for `rows` is loaded. C goes to cbuf [4][rows][16] float32. The staging of chunk
// c + 1 (vector stores) is issued before the tile loads of chunk c, which read the other half of
// the double buffer: a tile load right behind the stores that wrote its bytes waits for them.
template <int kParts>
void panel_rows(const uint16_t* panel, int64_t K, int64_t Kp, int rows, const uint16_t* parts, uint16_t* stage2,
                float* cbuf, bool prefetch_next) {
  const int64_t stride = Kp * 2;  // bytes per A row
  const uint16_t* hi = parts;  // kParts 1: the rounded x
  [[maybe_unused]] const uint16_t* lo = parts + rows * Kp;
  [[maybe_unused]] const uint16_t* lo2 = parts + 2 * rows * Kp;
  constexpr int64_t kStage = kGroups * 16 * kKChunk;  // one chunk's four B tiles
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  stage_chunk(panel, K, 0, stage2, prefetch_next || kKChunk < K);
  for (int64_t k0 = 0, c = 0; k0 < Kp; k0 += kKChunk, ++c) {
    const uint16_t* stage = stage2 + (c & 1) * kStage;
    if (k0 + kKChunk < Kp)
      stage_chunk(panel, K, k0 + kKChunk, stage2 + ((c + 1) & 1) * kStage, prefetch_next || k0 + 2 * kKChunk < K);
    _tile_loadd(4, hi + k0, stride);
    if constexpr (kParts == 3) {
      _tile_loadd(5, lo + k0, stride);
      _tile_loadd(6, lo2 + k0, stride);
    }
    // B_g, then its products into C_g (the tile intrinsics take register numbers as literal
    // tokens: a macro, not a loop).
#define SPECDEC_AMX_GROUP(g)                       \
    _tile_loadd(7, stage + (g) * 512, 64);         \
    _tile_dpbf16ps(g, 4, 7);                       \
    if constexpr (kParts == 3) {                   \
      _tile_dpbf16ps(g, 5, 7);                     \
      _tile_dpbf16ps(g, 6, 7);                     \
    }
    SPECDEC_AMX_GROUP(0)
    SPECDEC_AMX_GROUP(1)
    SPECDEC_AMX_GROUP(2)
    SPECDEC_AMX_GROUP(3)
#undef SPECDEC_AMX_GROUP
  }
  _tile_stored(0, cbuf + 0 * rows * 16, 64);
  _tile_stored(1, cbuf + 1 * rows * 16, 64);
  _tile_stored(2, cbuf + 2 * rows * 16, 64);
  _tile_stored(3, cbuf + 3 * rows * 16, 64);
}

// y[m * ldy + j] = C's output j of row m (+ bias[j]) for j < width: per row, B_2h and B_2h+1 hold
// outputs 32h + {0..3, 8..11, 16..19, 24..27} and 32h + {4..7, ...} (out_index), so one two-source
// permute per 16 outputs puts them back in order.
void store_panel(const float* cbuf, int rows, const float* bias, float* y, int64_t ldy, int64_t width) {
  // outputs 16q .. 16q + 15 of a half: 4-lane pieces of tile a (index < 16) and tile b (16 + index)
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int q = 0; q < kGroups; ++q) {
    const int64_t lanes = std::clamp<int64_t>(width - 16 * q, 0, 16);
    if (lanes == 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
    const __m512 b = bias == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, bias + 16 * q);
    const int h = q / 2;  // the 32-output half: tiles 2h and 2h + 1
    for (int m = 0; m < rows; ++m) {
      const __m512 ta = _mm512_loadu_ps(cbuf + ((2 * h) * rows + m) * 16);
      const __m512 tb = _mm512_loadu_ps(cbuf + ((2 * h + 1) * rows + m) * 16);
      __m512 out = _mm512_permutex2var_ps(ta, q % 2 == 0 ? first : second, tb);
      if (bias != nullptr) out = _mm512_add_ps(out, b);
      _mm512_mask_storeu_ps(y + m * ldy + 16 * q, mask, out);
    }
  }
}

bool amx_usable() {
  // The interleave and the split run AVX-512 F / BW / VL / DQ (cpu_isa.h's check, cap included).
  if (!cpu_isa_allows_amx() || !cpu_avx512_bw_vl_dq_fma_enabled()) return false;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;  // CPUID.(7, 0):EDX
  if (!(amx_bf16 && amx_tile)) return false;
  // Linux hands out the 8 KiB tile state only to processes that ask (kernel 5.16+).
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

}  // namespace

// A function-local static: packed_cpu.cpp reads this while initialising its own statics, and the
// order of static initialisation across files is unspecified.
bool packed_amx_enabled() {
  static const bool enabled = amx_usable();
  return enabled;
}

int64_t packed_amx_split_size(int64_t M, int64_t K, int nparts) {
  const int64_t Kp = (K + kKChunk - 1) / kKChunk * kKChunk;
  return (M + kRowsMax - 1) / kRowsMax * nparts * kRowsMax * Kp;
}

void packed_amx_split(const float* x, int64_t M, int64_t K, uint16_t* parts, int nparts) {
  const int64_t Kp = (K + kKChunk - 1) / kKChunk * kKChunk;
  for (int64_t b = 0; b * kRowsMax < M; ++b) {
    const int rows = static_cast<int>(std::min<int64_t>(kRowsMax, M - b * kRowsMax));
    if (nparts == 1) round_rows(x + b * kRowsMax * K, rows, K, Kp, parts + b * kRowsMax * Kp);
    else split_rows(x + b * kRowsMax * K, rows, K, Kp, parts + b * 3 * kRowsMax * Kp);
  }
}

void packed_panels_amx_bf16_split(const uint16_t* parts, int nparts, int64_t M, int64_t K, const uint16_t* packed,
                                  const float* bias, float* y, int64_t ldy, int64_t y_col0, int64_t N, int64_t p_begin,
                                  int64_t p_end) {
  if (M <= 0 || p_end <= p_begin) return;
  const int64_t Kp = (K + kKChunk - 1) / kKChunk * kKChunk;
  const int64_t blocks = (M + kRowsMax - 1) / kRowsMax;
  alignas(64) static thread_local uint16_t stage[2 * kGroups * 16 * kKChunk];
  alignas(64) static thread_local float cbuf[kGroups * kRowsMax * 16];
  auto rows_of = [&](int64_t b) { return static_cast<int>(std::min<int64_t>(kRowsMax, M - b * kRowsMax)); };
  auto parts_of = [&](int64_t b) { return parts + b * nparts * kRowsMax * Kp; };
  // Panel by panel, every row block while the panel is in L2 (a 96-row prefill chunk reads the
  // weights from memory once). Measured and not kept (96 rows, 2-core Xeon): staging a panel once
  // for all its row blocks instead of per block; two blocks x two groups per pass (four
  // independent C tiles, x's parts read twice per panel); the products ordered part by part.
  int loaded = 0;  // the row count the tile configuration holds
  for (int64_t p = p_begin; p < p_end; ++p) {
    const int64_t n0 = p * kPanel, width = std::min(kPanel, N - n0);
    for (int64_t b = 0; b < blocks; ++b) {
      const int rows = rows_of(b);
      if (rows != loaded) {
        const TileConfig cfg = config_for(rows);
        _tile_loadconfig(&cfg);
        loaded = rows;
      }
      if (Kp == 0) std::memset(cbuf, 0, sizeof(cbuf));
      else if (nparts == 1)
        panel_rows<1>(packed + p * K * kPanel, K, Kp, rows, parts_of(b), stage, cbuf, p + 1 < p_end && b + 1 == blocks);
      else
        panel_rows<3>(packed + p * K * kPanel, K, Kp, rows, parts_of(b), stage, cbuf, p + 1 < p_end && b + 1 == blocks);
      store_panel(cbuf, rows, bias == nullptr ? nullptr : bias + n0, y + b * kRowsMax * ldy + n0 - y_col0, ldy, width);
    }
  }
  _tile_release();
}

}  // namespace specdec::skinny
#pragma GCC pop_options

#else
namespace specdec::skinny {
bool packed_amx_enabled() { return false; }
int64_t packed_amx_split_size(int64_t, int64_t, int) { return 0; }
void packed_amx_split(const float*, int64_t, int64_t, uint16_t*, int) {}
void packed_panels_amx_bf16_split(const uint16_t*, int, int64_t, int64_t, const uint16_t*, const float*, float*,
                                  int64_t, int64_t, int64_t, int64_t, int64_t) {}
}  // namespace specdec::skinny
#endif
