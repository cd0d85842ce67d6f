// The packed-panel skinny linear (see packed_cpu.h): AVX-512 and AVX2 kernels picked at run time (a
// default build targets baseline x86-64) and a portable loop, all giving the same bits.
#include "kernels/skinny_linear/packed_cpu.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/common/cpu_isa.h"
#include "kernels/common/dtype.h"
#include "kernels/skinny_linear/packed_amx.h"

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define SPECDEC_PACKED_X86 1
#endif

namespace specdec::skinny {
namespace {

inline float weight_at(const float* w, int64_t i) { return w[i]; }
inline float weight_at(const uint16_t* w, int64_t i) { return bits_to_float(static_cast<uint32_t>(w[i]) << 16); }

// ---- portable: one std::fma chain per output, in the order the vector kernel uses ----------------
template <typename W>
void panels_portable(const float* x, int64_t M, int64_t K, const W* packed, const float* bias, float* y,
                     int64_t ldy, int64_t y_col0, int64_t N, int64_t p_begin, int64_t p_end) {
  for (int64_t p = p_begin; p < p_end; ++p) {
    const W* panel = packed + p * K * kPanel;
    const int64_t width = std::min(kPanel, N - p * kPanel);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < width; ++j) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) acc = std::fma(x[m * K + k], weight_at(panel, k * kPanel + j), acc);
        const int64_t n = p * kPanel + j;
        y[m * ldy + n - y_col0] = bias == nullptr ? acc : acc + bias[n];
      }
  }
}

#ifdef SPECDEC_PACKED_X86
#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512dq,fma")))

// Rows of x per pass over a panel: 6 rows x 4 accumulators + 4 weights + 1 broadcast = 29 of the
// 32 zmm registers. Longer inputs take several passes; a panel (K * 256 bytes as float32) is then
// re-read from L1 / L2, not from memory.
constexpr int kBlockM = 6;

// Prefetch distance along the packed stream: 1 KiB, a few k-steps ahead; past a panel's end it
// reaches into the next panel, which is what runs next.
constexpr int64_t kPrefetchBytes = 1024;

SPECDEC_AVX512 inline __m512 load16(const float* w) { return _mm512_loadu_ps(w); }
SPECDEC_AVX512 inline __m512 load16(const uint16_t* w) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

// One k-step of a row's four fma chains over a panel's 64 outputs: acc[j] = fma(x, w_j, acc[j]).
// Inlined into both kernels below, whose accumulators must stay in registers.
__attribute__((target("avx512f,avx512dq,fma"), always_inline)) inline void fma_row(__m512* acc, float x, __m512 w0,
                                                                                  __m512 w1, __m512 w2, __m512 w3) {
  const __m512 xb = _mm512_set1_ps(x);
  acc[0] = _mm512_fmadd_ps(xb, w0, acc[0]);
  acc[1] = _mm512_fmadd_ps(xb, w1, acc[1]);
  acc[2] = _mm512_fmadd_ps(xb, w2, acc[2]);
  acc[3] = _mm512_fmadd_ps(xb, w3, acc[3]);
}

// One panel (outputs n0 .. n0 + width - 1, width <= kPanel) against MB rows of x: y[m * ldy + j].
template <int MB, typename W>
SPECDEC_AVX512 void panel_block(const float* x, int64_t K, const W* panel, const float* bias, float* y,
                                int64_t ldy, int64_t n0, int64_t width) {
  constexpr int64_t kLineElems = 64 / sizeof(W);  // weights per cache line
  __m512 acc[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const W* w = panel + k * kPanel;
    for (int64_t e = 0; e < kPanel; e += kLineElems)
      _mm_prefetch(reinterpret_cast<const char*>(w + e) + kPrefetchBytes, _MM_HINT_T0);
    const __m512 w0 = load16(w), w1 = load16(w + 16), w2 = load16(w + 32), w3 = load16(w + 48);
    for (int m = 0; m < MB; ++m) fma_row(acc[m], x[m * K + k], w0, w1, w2, w3);
  }
  for (int j = 0; j < 4; ++j) {
    const int64_t lanes = std::clamp<int64_t>(width - 16 * j, 0, 16);
    if (lanes == 0) break;
    const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
    const __m512 b = bias == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, bias + n0 + 16 * j);
    for (int m = 0; m < MB; ++m) {
      const __m512 out = bias == nullptr ? acc[m][j] : _mm512_add_ps(acc[m][j], b);
      _mm512_mask_storeu_ps(y + m * ldy + 16 * j, mask, out);
    }
  }
}

// bfloat16 panels against more rows than one pass takes (a long verification, a prefill chunk).
// panel_block widens each weight as it loads it (a zero-extend and a shift, on the same ports as
// the multiply-adds: 8 of every 32 vector ops at 6 rows), and every pass over the panel widens it
// again. Here each block of kStageK k-rows is widened once into a float32 stage in L1 and every
// pass of 6 rows reads it from there: a pass is loads and multiply-adds only. Its accumulators go
// to a scratch [M][64] between blocks (stored and reloaded exactly, so each output is still the
// one fma chain over k in order: the bits of panel_block). 96 rows: 24 KiB of scratch and 16 KiB of
// stage. Measured on a 2-core Sapphire Rapids VM without AMX (one thread, a [17920, 1536] bf16
// weight): 12 / 16 / 32 rows 6.0 / 9.0 / 17.8 ms re-widening, 5.7 / 7.6 / 14.9 ms staged (57-59 G
// multiply-adds/s; 6 rows in one pass: 62); a 32-row forward of the 1.5B ~13% faster on 2 threads.
// Blocks of 64 k-rows rather than 32 halve the accumulators' trips through the scratch; 128
// measured slower (a 32 KiB stage beside the scratch outgrows L1). On a 2-core Ice Lake VM, 2
// threads, best of 15 in alternate processes: [17920, 1536] at 96 rows 25.6-32.8 ms with 32,
// 23.1-26.1 with 64; [1536, 8960] 12.0-15.8 against 12.7-13.6; whole-process A/B over three
// 170-token prefills and seven 16- / 32-row forwards of the 1.5B: 0.98x the wall time (medians of
// four pairs).
constexpr int64_t kStageK = 64;

// Rows [0, MB) of x over k-rows [k0, k1) of the stage ([k1 - k0][64] float32), continuing the
// chains held in acc_rows [MB][64].
template <int MB>
SPECDEC_AVX512 void staged_pass(const float* x, int64_t K, int64_t k0, int64_t k1, const float* stage,
                                float* acc_rows) {
  __m512 acc[MB][4];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm512_loadu_ps(acc_rows + m * kPanel + 16 * j);
  for (int64_t k = k0; k < k1; ++k) {
    const float* w = stage + (k - k0) * kPanel;
    const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16), w2 = _mm512_loadu_ps(w + 32),
                 w3 = _mm512_loadu_ps(w + 48);
    for (int m = 0; m < MB; ++m) fma_row(acc[m], x[m * K + k], w0, w1, w2, w3);
  }
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(acc_rows + m * kPanel + 16 * j, acc[m][j]);
}

// panels_avx512's contract for bfloat16 panels and M > kBlockM rows.
SPECDEC_AVX512 void panels_avx512_staged(const float* x, int64_t M, int64_t K, const uint16_t* packed,
                                         const float* bias, float* y, int64_t ldy, int64_t y_col0, int64_t N,
                                         int64_t p_begin, int64_t p_end) {
  thread_local std::vector<float> acc;
  alignas(64) float stage[kStageK * kPanel];
  acc.resize(static_cast<size_t>(M * kPanel));
  for (int64_t p = p_begin; p < p_end; ++p) {
    const uint16_t* panel = packed + p * K * kPanel;
    const int64_t n0 = p * kPanel, width = std::min(kPanel, N - n0);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t k0 = 0; k0 < K; k0 += kStageK) {
      const int64_t k1 = std::min(K, k0 + kStageK);
      for (int64_t k = k0; k < k1; ++k) {  // widen the block once (and fetch ahead in the stream)
        const uint16_t* w = panel + k * kPanel;
        _mm_prefetch(reinterpret_cast<const char*>(w) + kPrefetchBytes, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w) + kPrefetchBytes + 64, _MM_HINT_T0);
        float* s = stage + (k - k0) * kPanel;
        _mm512_store_ps(s, load16(w));
        _mm512_store_ps(s + 16, load16(w + 16));
        _mm512_store_ps(s + 32, load16(w + 32));
        _mm512_store_ps(s + 48, load16(w + 48));
      }
      for (int64_t m0 = 0; m0 < M; m0 += kBlockM) {
        const float* xb = x + m0 * K;
        float* rows = acc.data() + m0 * kPanel;
        switch (std::min<int64_t>(kBlockM, M - m0)) {
          case 1: staged_pass<1>(xb, K, k0, k1, stage, rows); break;
          case 2: staged_pass<2>(xb, K, k0, k1, stage, rows); break;
          case 3: staged_pass<3>(xb, K, k0, k1, stage, rows); break;
          case 4: staged_pass<4>(xb, K, k0, k1, stage, rows); break;
          case 5: staged_pass<5>(xb, K, k0, k1, stage, rows); break;
          default: staged_pass<6>(xb, K, k0, k1, stage, rows); break;
        }
      }
    }
    for (int j = 0; j < 4; ++j) {  // + bias, as panel_block
      const int64_t lanes = std::clamp<int64_t>(width - 16 * j, 0, 16);
      if (lanes == 0) break;
      const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1u);
      const __m512 b = bias == nullptr ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask, bias + n0 + 16 * j);
      for (int64_t m = 0; m < M; ++m) {
        const __m512 a = _mm512_loadu_ps(acc.data() + m * kPanel + 16 * j);
        _mm512_mask_storeu_ps(y + m * ldy + n0 - y_col0 + 16 * j, mask, bias == nullptr ? a : _mm512_add_ps(a, b));
      }
    }
  }
}

template <typename W>
SPECDEC_AVX512 void panels_avx512(const float* x, int64_t M, int64_t K, const W* packed, const float* bias,
                                  float* y, int64_t ldy, int64_t y_col0, int64_t N, int64_t p_begin,
                                  int64_t p_end) {
  if constexpr (std::is_same_v<W, uint16_t>) {
    if (M > kBlockM) {
      panels_avx512_staged(x, M, K, packed, bias, y, ldy, y_col0, N, p_begin, p_end);
      return;
    }
  }
  for (int64_t p = p_begin; p < p_end; ++p) {
    const W* panel = packed + p * K * kPanel;
    const int64_t n0 = p * kPanel, width = std::min(kPanel, N - n0);
    for (int64_t m0 = 0; m0 < M; m0 += kBlockM) {
      const float* xb = x + m0 * K;
      float* yb = y + m0 * ldy + n0 - y_col0;
      switch (std::min<int64_t>(kBlockM, M - m0)) {
        case 1: panel_block<1>(xb, K, panel, bias, yb, ldy, n0, width); break;
        case 2: panel_block<2>(xb, K, panel, bias, yb, ldy, n0, width); break;
        case 3: panel_block<3>(xb, K, panel, bias, yb, ldy, n0, width); break;
        case 4: panel_block<4>(xb, K, panel, bias, yb, ldy, n0, width); break;
        case 5: panel_block<5>(xb, K, panel, bias, yb, ldy, n0, width); break;
        default: panel_block<6>(xb, K, panel, bias, yb, ldy, n0, width); break;
      }
    }
  }
}

#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))
#define SPECDEC_AVX2_INLINE __attribute__((target("avx2,fma"), always_inline)) inline

// 16 consecutive weights as two float32 vectors: outputs 0..7 and 8..15 (float32), or the even and
// the odd outputs (bfloat16: a shift and a mask, no shuffle).
SPECDEC_AVX2_INLINE void widen2(const float* w, __m256& w0, __m256& w1) {
  w0 = _mm256_loadu_ps(w);
  w1 = _mm256_loadu_ps(w + 8);
}
SPECDEC_AVX2_INLINE void widen2(const uint16_t* w, __m256& w0, __m256& w1) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  w1 = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// The AVX2 kernel walks each panel in blocks of kKBlock k-rows (4 KiB of bfloat16 weights, 8 KiB
// of float32) and, for every block, runs all the rows of x over it before moving on:
//
//          panel p: [K][64] weights                      y rows: accumulators in a scratch [M][64]
//   k0 ┌──────────────────────────────┐                 (raw order; see widen2), reloaded and
//      │ block: 32 k-rows x 64        │ ── rows 0..5 ──▶ stored once per block and slice: exact,
//      │ (from memory once, then L1)  │ ── rows 6..11 ─▶ so each output stays one fma chain over k
//   k1 └──────────────────────────────┘ ...             in order)
//
// so a panel streams from memory once, in order, for any number of rows (a 5-row verification or a
// 96-row prefill chunk reads the weights once, as one-token decoding does). AVX2 has 16 ymm
// registers of 8 lanes: a pass covers MB rows x NV vectors (8 * NV outputs of the block), with MB *
// NV >= 8 accumulators to cover the FMA latency (4 cycles x 2 pipes) and MB * NV + 3 <= 16:
// (MB, NV) = (1, 8), (2, 4), (4, 2), (5, 2), (6, 2). Rows go in blocks of 6; three rows go as 2 + 1
// (3 x 4 accumulators, their broadcasts and the weights would spill, and a spilled accumulator
// adds a store-to-load round trip to its chain on every k). The 16-output passes (4 to 6 rows)
// read the block from a copy staged in L1 by their first pass (kblock_stage_avx2). Measured on
// Zen 3 (one core, data in L2; peak 50 G multiply-add lanes/s): 22 G at 1 row (memory-bound
// anyway), 31 at 2, 35 at 5, 41 at 16, 43 at 96; a 5-row block streams from memory at 1.3x the
// time of a 1-row one.
//
// bfloat16 weights are widened two vectors at a time without a shuffle: a 32-bit lane of 16 loaded
// bf16 holds outputs 2l (low half) and 2l + 1 (high half), so a shift left by 16 gives the even
// outputs as float32 and masking the low half the odd ones. Accumulator pair (j, j + 1) holds the
// even and odd outputs of those 16; the final store puts them back in order.
// 32 k-rows per block: 4 KiB of bf16 weights, staged in L1 next to the accumulators; 64 or 128
// measured slower out of cache (Zen 3), not faster in it.
constexpr int64_t kKBlock = 32;
// Prefetch distance of a block's first pass, in k-rows: 16 KiB of bf16 ahead, four blocks (48 to
// 256 measured within noise of each other; none is slower than the hardware prefetcher alone).
constexpr int64_t kPrefetchRows = 128;
constexpr int kBlockM2 = 6;

// MB rows x NV vectors over k-rows [k0, k1) of a block whose k-row k holds the 8 * NV weights at
// w + (k - k0) * ld (the panel itself: ld = kPanel; a staged slice: ld = 16). Accumulators start
// from zero (first) or from acc [MB][kPanel] (raw order; see widen2) and go back there. With pf,
// each step prefetches the whole panel k-row at pf + (k - k0) * kPanel.
template <int MB, int NV, typename W>
SPECDEC_AVX2 void kblock_avx2(const float* x, int64_t K, const W* w, int64_t ld, int64_t k0, int64_t k1, float* acc,
                              bool first, const W* pf) {
  static_assert(NV % 2 == 0, "weights widen in pairs of vectors");
  // Every loop over the accumulators fully unrolled: an accumulator array GCC cannot scalarise is
  // kept in memory, stored on every k.
  __m256 a[MB][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) a[m][j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + m * kPanel + 8 * j);
  for (int64_t k = k0; k < k1; ++k, w += ld) {
    if (pf != nullptr)
      for (int64_t e = 0; e < kPanel; e += 64 / static_cast<int64_t>(sizeof(W)))
        _mm_prefetch(reinterpret_cast<const char*>(pf + (k - k0) * kPanel + e), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int j = 0; j < NV; j += 2) {
      __m256 w0, w1;
      widen2(w + 8 * j, w0, w1);
#pragma GCC unroll 8
      for (int m = 0; m < MB; ++m) {
        const __m256 xb = _mm256_broadcast_ss(x + m * K + k);
        a[m][j] = _mm256_fmadd_ps(xb, w0, a[m][j]);
        a[m][j + 1] = _mm256_fmadd_ps(xb, w1, a[m][j + 1]);
      }
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) _mm256_storeu_ps(acc + m * kPanel + 8 * j, a[m][j]);
}

// The first 16-output pass over block k-rows [k0, k1) (MB >= 4 rows, slice 0), which also stages
// the whole block, stage[s][k - k0][16] for the four slices s of 16 outputs (raw: bf16 stays bf16),
// and prefetches the panel rows kPrefetchRows ahead. The other passes then read contiguous rows
// from L1; read in place, their 32-byte pieces of 128-byte bf16 k-rows ran at two thirds of the
// speed (measured, Zen 3). Staging inside this pass lets its stores (4 per k-row as bf16) run
// under the pass's 2 * MB FMAs: a separate copy loop cost about a quarter of a 5-row block's time,
// and staging widened float32 (8 stores per k-row) made this pass store-bound.
template <int MB, typename W>
SPECDEC_AVX2 void kblock_stage_avx2(const float* x, int64_t K, const W* panel, int64_t k0, int64_t k1, float* acc,
                                    bool first, W* stage, bool prefetch) {
  constexpr int64_t kVec = 32 / sizeof(W);  // elements per 32-byte vector
  __m256 a[MB][2];
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) a[m][j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + m * kPanel + 8 * j);
  for (int64_t k = k0; k < k1; ++k) {
    const W* row = panel + k * kPanel;
    if (prefetch)
      for (int64_t e = 0; e < kPanel; e += 64 / static_cast<int64_t>(sizeof(W)))
        _mm_prefetch(reinterpret_cast<const char*>(row + kPrefetchRows * kPanel + e), _MM_HINT_T0);
    W* dst = stage + (k - k0) * 16;
#pragma GCC unroll 8
    for (int64_t e = 0; e < kPanel; e += kVec)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (e / 16) * kKBlock * 16 + e % 16),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + e)));
    __m256 w0, w1;
    widen2(row, w0, w1);
#pragma GCC unroll 8
    for (int m = 0; m < MB; ++m) {
      const __m256 xb = _mm256_broadcast_ss(x + m * K + k);
      a[m][0] = _mm256_fmadd_ps(xb, w0, a[m][0]);
      a[m][1] = _mm256_fmadd_ps(xb, w1, a[m][1]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MB; ++m)
#pragma GCC unroll 2
    for (int j = 0; j < 2; ++j) _mm256_storeu_ps(acc + m * kPanel + 8 * j, a[m][j]);
}

// Rows [0, MB) of x over block k-rows [k0, k1) of a panel whose outputs past `width` are padding:
// 16-output passes (MB >= 4), the first of the block staging it (`stage_now`), the others reading
// the staged block; else 64- or 32-output passes from the panel, the first of them prefetching
// when asked (no row block stages).
template <int MB, typename W>
SPECDEC_AVX2 void rows_kblock_avx2(const float* x, int64_t K, const W* panel, W* stage, int64_t width,
                                   int64_t k0, int64_t k1, float* acc, bool first, bool prefetch, bool stage_now) {
  constexpr int NV = MB == 1 ? 8 : MB == 2 ? 4 : 2;
  for (int64_t col0 = 0; col0 < width; col0 += 8 * NV) {
    if constexpr (NV == 2) {
      if (col0 == 0 && stage_now)
        kblock_stage_avx2<MB, W>(x, K, panel, k0, k1, acc, first, stage, prefetch);
      else
        kblock_avx2<MB, NV, W>(x, K, stage + (col0 / 16) * kKBlock * 16, 16, k0, k1, acc + col0, first, nullptr);
    } else {
      kblock_avx2<MB, NV, W>(x, K, panel + k0 * kPanel + col0, kPanel, k0, k1, acc + col0, first,
                             prefetch && col0 == 0 ? panel + (k0 + kPrefetchRows) * kPanel : nullptr);
    }
  }
}

// y[m * ldy + j] = acc[m][j] (+ bias[n0 + j]) for j < width, accumulators back in output order.
template <typename W>
SPECDEC_AVX2 void store_panel_avx2(const float* acc_rows, int64_t M, const float* bias, float* y, int64_t ldy,
                                   int64_t n0, int64_t width) {
  constexpr bool kBf16 = sizeof(W) == 2;
  for (int64_t first = 0; first < width; first += 16) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(width - first)), lanes);
    const __m256i mask1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(width - first - 8)), lanes);
    const __m256 b0 = bias == nullptr ? _mm256_setzero_ps() : _mm256_maskload_ps(bias + n0 + first, mask0);
    const __m256 b1 = bias == nullptr ? _mm256_setzero_ps() : _mm256_maskload_ps(bias + n0 + first + 8, mask1);
    for (int64_t m = 0; m < M; ++m) {
      __m256 lo = _mm256_loadu_ps(acc_rows + m * kPanel + first);
      __m256 hi = _mm256_loadu_ps(acc_rows + m * kPanel + first + 8);
      if constexpr (kBf16) {  // even / odd outputs -> outputs 0..7 and 8..15 of these 16
        const __m256 a = _mm256_unpacklo_ps(lo, hi), c = _mm256_unpackhi_ps(lo, hi);
        lo = _mm256_permute2f128_ps(a, c, 0x20);
        hi = _mm256_permute2f128_ps(a, c, 0x31);
      }
      if (bias != nullptr) {
        lo = _mm256_add_ps(lo, b0);
        hi = _mm256_add_ps(hi, b1);
      }
      _mm256_maskstore_ps(y + m * ldy + first, mask0, lo);
      _mm256_maskstore_ps(y + m * ldy + first + 8, mask1, hi);
    }
  }
}

template <typename W>
SPECDEC_AVX2 void panels_avx2(const float* x, int64_t M, int64_t K, const W* packed, const float* bias, float* y,
                              int64_t ldy, int64_t y_col0, int64_t N, int64_t p_begin, int64_t p_end) {
  // Accumulators of every row for one panel: [M][kPanel] (24 KiB at M = 96), and one staged
  // block (4 KiB of bf16), reused per call.
  thread_local std::vector<float> acc;
  thread_local std::vector<W> stage;
  acc.resize(static_cast<size_t>(M * kPanel));
  stage.resize(static_cast<size_t>(kKBlock * kPanel));
  const bool staged = M >= 4;  // some row block runs 16-output passes
  for (int64_t p = p_begin; p < p_end; ++p) {
    const W* panel = packed + p * K * kPanel;
    const int64_t n0 = p * kPanel, width = std::min(kPanel, N - n0);
    for (int64_t k0 = 0; k0 < K; k0 += kKBlock) {
      const int64_t k1 = std::min(K, k0 + kKBlock);
      // Row blocks of 6 (the last one shorter); the first, of 4 rows or more when M >= 4, stages
      // the k-block for the 16-output passes of all of them.
      bool stage_now = staged;
      for (int64_t m0 = 0, mb; m0 < M; m0 += mb) {
        mb = std::min<int64_t>(kBlockM2, M - m0);
        const float* xb = x + m0 * K;
        float* ab = acc.data() + m0 * kPanel;
        // Prefetch in the block's first pass, not past this call's last panel (another thread's).
        const bool first = k0 == 0, pf = m0 == 0 && (p + 1 < p_end || k1 + kPrefetchRows <= K);
        W* st = stage.data();
        switch (mb) {
          case 1: rows_kblock_avx2<1>(xb, K, panel, st, width, k0, k1, ab, first, pf, false); break;
          case 2: rows_kblock_avx2<2>(xb, K, panel, st, width, k0, k1, ab, first, pf, false); break;
          case 3: mb = 2; rows_kblock_avx2<2>(xb, K, panel, st, width, k0, k1, ab, first, pf, false); break;  // then 1
          case 4: rows_kblock_avx2<4>(xb, K, panel, st, width, k0, k1, ab, first, pf, stage_now); break;
          case 5: rows_kblock_avx2<5>(xb, K, panel, st, width, k0, k1, ab, first, pf, stage_now); break;
          default: rows_kblock_avx2<6>(xb, K, panel, st, width, k0, k1, ab, first, pf, stage_now); break;
        }
        if (mb >= 4) stage_now = false;
      }
    }
    if (K == 0) std::fill(acc.begin(), acc.end(), 0.0f);
    store_panel_avx2<W>(acc.data(), M, bias, y + n0 - y_col0, ldy, n0, width);
  }
}

// The widest tier SPECDEC_CPU_ISA allows on this CPU (kernels/common/cpu_isa.h).
const bool kAvx512 = cpu_avx512_fma_enabled();
const bool kAvx2 = cpu_avx2_is_widest();
const bool kAmx = packed_amx_enabled();
#else
const bool kAmx = false;
const bool kAvx512 = false;
const bool kAvx2 = false;
#endif

template <typename W>
void panels(const float* x, int64_t M, int64_t K, const W* packed, const float* bias, float* y, int64_t ldy,
            int64_t y_col0, int64_t N, int64_t p_begin, int64_t p_end) {
#ifdef SPECDEC_PACKED_X86
  // (bfloat16 panels on the AMX tier do not come here: see prepare_rows_bf16)
  if (kAvx512) {
    panels_avx512(x, M, K, packed, bias, y, ldy, y_col0, N, p_begin, p_end);
    return;
  }
  if (kAvx2) {
    panels_avx2(x, M, K, packed, bias, y, ldy, y_col0, N, p_begin, p_end);
    return;
  }
#endif
  panels_portable(x, M, K, packed, bias, y, ldy, y_col0, N, p_begin, p_end);
}

}  // namespace

void packed_linear_cpu_panels(const float* x, int64_t M, int64_t K, const float* packed, const float* bias,
                              float* y, int64_t N, int64_t p_begin, int64_t p_end) {
  panels(x, M, K, packed, bias, y, N, 0, N, p_begin, p_end);
}

PreparedRowsBf16 prepare_rows_bf16(const float* x, int64_t M, int64_t K, std::vector<uint16_t>& scratch,
                                   bool rounded) {
  if (!kAmx || M <= 0) return {x, M, K, nullptr, 3};
  const int nparts = rounded ? 1 : 3;
  scratch.resize(static_cast<size_t>(packed_amx_split_size(M, K, nparts)));
  packed_amx_split(x, M, K, scratch.data(), nparts);
  return {x, M, K, scratch.data(), nparts};
}

void packed_linear_cpu_panels_bf16(const PreparedRowsBf16& rows, const uint16_t* packed, const float* bias, float* y,
                                   int64_t N, int64_t p_begin, int64_t p_end) {
  if (rows.amx_parts != nullptr)
    packed_panels_amx_bf16_split(rows.amx_parts, rows.amx_nparts, rows.M, rows.K, packed, bias, y, N, 0, N, p_begin,
                                 p_end);
  else
    panels(rows.x, rows.M, rows.K, packed, bias, y, N, 0, N, p_begin, p_end);
}

void packed_linear_cpu_panels_into(const float* x, int64_t M, int64_t K, const float* packed, float* y, int64_t ldy,
                                   int64_t N, int64_t p_begin, int64_t p_end) {
  panels(x, M, K, packed, nullptr, y, ldy, p_begin * kPanel, N, p_begin, p_end);
}

void packed_linear_cpu_panels_into_bf16(const PreparedRowsBf16& rows, const uint16_t* packed, float* y, int64_t ldy,
                                        int64_t N, int64_t p_begin, int64_t p_end) {
  if (rows.amx_parts != nullptr)
    packed_panels_amx_bf16_split(rows.amx_parts, rows.amx_nparts, rows.M, rows.K, packed, nullptr, y, ldy,
                                 p_begin * kPanel, N, p_begin, p_end);
  else
    panels(rows.x, rows.M, rows.K, packed, nullptr, y, ldy, p_begin * kPanel, N, p_begin, p_end);
}

const char* packed_linear_cpu_isa() { return kAvx512 ? "avx512" : kAvx2 ? "avx2" : "portable"; }

const char* packed_linear_cpu_isa_bf16() { return kAmx ? "amx" : packed_linear_cpu_isa(); }

}  // namespace specdec::skinny
