// The packed-panel skinny linear (see packed_cpu.h): AVX-512 and AVX2 kernels picked at run time (a
// default build targets baseline x86-64) and a portable loop, all giving the same bits.
#include "kernels/skinny_linear/packed_cpu.h"

#include <algorithm>
#include <cmath>

#include "kernels/common/cpu_isa.h"
#include "kernels/common/dtype.h"

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
    for (int m = 0; m < MB; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * K + k]);
      acc[m][0] = _mm512_fmadd_ps(xb, w0, acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(xb, w1, acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(xb, w2, acc[m][2]);
      acc[m][3] = _mm512_fmadd_ps(xb, w3, acc[m][3]);
    }
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

template <typename W>
SPECDEC_AVX512 void panels_avx512(const float* x, int64_t M, int64_t K, const W* packed, const float* bias,
                                  float* y, int64_t ldy, int64_t y_col0, int64_t N, int64_t p_begin,
                                  int64_t p_end) {
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
// the odd outputs (bfloat16; two shifts, so no mask constant takes a register).
SPECDEC_AVX2_INLINE void widen2(const float* w, __m256& w0, __m256& w1) {
  w0 = _mm256_loadu_ps(w);
  w1 = _mm256_loadu_ps(w + 8);
}
SPECDEC_AVX2_INLINE void widen2(const uint16_t* w, __m256& w0, __m256& w1) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  w1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(v, 16), 16));
}

// AVX2 has 16 ymm registers of 8 lanes, so a pass covers NV * 8 outputs of the panel (a slice)
// against MB rows: MB * NV accumulators + MB broadcasts + 2 weights <= 16 (NV = 8 for one row, 4
// for two, 2 for three or four). The panel then takes kPanel / (8 * NV) passes; each reads its own
// cache lines of every k-row, so the weights still stream from memory once. Each output is the
// same fma chain over k as in the other kernels. (Loading a k's weights first and broadcasting
// each row against them, 6 rows per pass, measured slower: GCC spills there.)
//
// bfloat16 weights are widened two vectors at a time without a shuffle: a 32-bit lane of 16
// loaded bf16 holds outputs 2l (low half) and 2l + 1 (high half), so a shift left by 16 gives the
// even outputs as float32 and a shift right then left by 16 the odd ones. Accumulator pair
// (j, j + 1) then holds the even and odd outputs of those 16, and the store puts them back in order.
template <int MB, int NV, typename W>
SPECDEC_AVX2 void slice_block_avx2(const float* x, int64_t K, const W* panel, int64_t col0, const float* bias,
                                   float* y, int64_t ldy, int64_t n0, int64_t width) {
  static_assert(NV % 2 == 0, "bf16 weights widen in pairs of vectors");
  constexpr bool kBf16 = sizeof(W) == 2;
  constexpr int64_t kLineElems = 64 / sizeof(W);
  __m256 acc[MB][NV];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NV; ++j) acc[m][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const W* w = panel + k * kPanel + col0;
    for (int64_t e = 0; e < 8 * NV; e += kLineElems)
      _mm_prefetch(reinterpret_cast<const char*>(w + e) + kPrefetchBytes, _MM_HINT_T0);
    __m256 xb[MB];
    for (int m = 0; m < MB; ++m) xb[m] = _mm256_broadcast_ss(x + m * K + k);
    for (int j = 0; j < NV; j += 2) {
      __m256 w0, w1;
      widen2(w + 8 * j, w0, w1);
      for (int m = 0; m < MB; ++m) {
        acc[m][j] = _mm256_fmadd_ps(xb[m], w0, acc[m][j]);
        acc[m][j + 1] = _mm256_fmadd_ps(xb[m], w1, acc[m][j + 1]);
      }
    }
  }
  // Outputs col0 .. col0 + 8 * NV - 1 of the panel; those at or past width are its zero padding.
  // Fully unrolled, shuffles and masked stores: an accumulator indexed at run time (or read
  // through memory) makes GCC keep them all in memory, storing each one on every k.
#pragma GCC unroll 8
  for (int j = 0; j < NV; j += 2) {
    const int64_t first = col0 + 8 * j;
    if (first >= width) continue;
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i mask0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(width - first)), lanes);
    const __m256i mask1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(width - first - 8)), lanes);
    const __m256 b0 = bias == nullptr ? _mm256_setzero_ps() : _mm256_maskload_ps(bias + n0 + first, mask0);
    const __m256 b1 = bias == nullptr ? _mm256_setzero_ps() : _mm256_maskload_ps(bias + n0 + first + 8, mask1);
#pragma GCC unroll 4
    for (int m = 0; m < MB; ++m) {
      __m256 lo = acc[m][j], hi = acc[m][j + 1];
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

// One panel against MB <= 4 rows of x, in slices of 64 (MB = 1), 32 (MB = 2) or 16 outputs.
template <int MB, typename W>
SPECDEC_AVX2 void panel_block_avx2(const float* x, int64_t K, const W* panel, const float* bias, float* y,
                                   int64_t ldy, int64_t n0, int64_t width) {
  constexpr int NV = MB == 1 ? 8 : MB == 2 ? 4 : 2;
  for (int64_t col0 = 0; col0 < width; col0 += 8 * NV)
    slice_block_avx2<MB, NV>(x, K, panel, col0, bias, y, ldy, n0, width);
}

constexpr int kBlockM2 = 4;

template <typename W>
SPECDEC_AVX2 void panels_avx2(const float* x, int64_t M, int64_t K, const W* packed, const float* bias, float* y,
                              int64_t ldy, int64_t y_col0, int64_t N, int64_t p_begin, int64_t p_end) {
  for (int64_t p = p_begin; p < p_end; ++p) {
    const W* panel = packed + p * K * kPanel;
    const int64_t n0 = p * kPanel, width = std::min(kPanel, N - n0);
    for (int64_t m0 = 0; m0 < M; m0 += kBlockM2) {
      const float* xb = x + m0 * K;
      float* yb = y + m0 * ldy + n0 - y_col0;
      switch (std::min<int64_t>(kBlockM2, M - m0)) {
        case 1: panel_block_avx2<1>(xb, K, panel, bias, yb, ldy, n0, width); break;
        case 2: panel_block_avx2<2>(xb, K, panel, bias, yb, ldy, n0, width); break;
        case 3: panel_block_avx2<3>(xb, K, panel, bias, yb, ldy, n0, width); break;
        default: panel_block_avx2<4>(xb, K, panel, bias, yb, ldy, n0, width); break;
      }
    }
  }
}

// The widest tier SPECDEC_CPU_ISA allows on this CPU (kernels/common/cpu_isa.h).
const bool kAvx512 = cpu_avx512_fma_enabled();
const bool kAvx2 = cpu_avx2_is_widest();
#else
const bool kAvx512 = false;
const bool kAvx2 = false;
#endif

template <typename W>
void panels(const float* x, int64_t M, int64_t K, const W* packed, const float* bias, float* y, int64_t ldy,
            int64_t y_col0, int64_t N, int64_t p_begin, int64_t p_end) {
#ifdef SPECDEC_PACKED_X86
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

void packed_linear_cpu_panels_bf16(const float* x, int64_t M, int64_t K, const uint16_t* packed,
                                   const float* bias, float* y, int64_t N, int64_t p_begin, int64_t p_end) {
  panels(x, M, K, packed, bias, y, N, 0, N, p_begin, p_end);
}

void packed_linear_cpu_panels_into(const float* x, int64_t M, int64_t K, const float* packed, float* y, int64_t ldy,
                                   int64_t N, int64_t p_begin, int64_t p_end) {
  panels(x, M, K, packed, nullptr, y, ldy, p_begin * kPanel, N, p_begin, p_end);
}

void packed_linear_cpu_panels_into_bf16(const float* x, int64_t M, int64_t K, const uint16_t* packed, float* y,
                                        int64_t ldy, int64_t N, int64_t p_begin, int64_t p_end) {
  panels(x, M, K, packed, nullptr, y, ldy, p_begin * kPanel, N, p_begin, p_end);
}

const char* packed_linear_cpu_isa() { return kAvx512 ? "avx512" : kAvx2 ? "avx2" : "portable"; }

}  // namespace specdec::skinny
