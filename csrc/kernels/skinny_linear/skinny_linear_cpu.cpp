// Skinny float32 linear on the CPU (see skinny_linear_cpu.h): an AVX-512 kernel, picked at run
// time (a default build targets baseline x86-64), and a portable loop with the same per-output
// order of operations in spirit (its own bits; one machine runs one kernel for a given K).
#include "kernels/skinny_linear/skinny_linear_cpu.h"

#include <algorithm>

#include "kernels/common/cpu_isa.h"
#include "kernels/common/dtype.h"

#if defined(__x86_64__)
// GCC 12's own avx512fintrin.h trips -Wmaybe-uninitialized in _mm512_setzero_ps-style helpers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#define SPECDEC_SKINNY_X86 1
#endif

namespace specdec::skinny {
namespace {

// A weight element as float: float32 as is, bfloat16 (raw bits) widened exactly.
inline float weight_at(const float* w, int64_t i) { return w[i]; }
inline float weight_at(const uint16_t* w, int64_t i) { return bits_to_float(static_cast<uint32_t>(w[i]) << 16); }

// ---- portable: per output, 16 partial sums over K in order (lane k % 16), then a pairwise
// reduction; the inner loops autovectorise at any width. ----------------------------------------
template <typename W>
void rows_portable(const float* x, int64_t M, int64_t K, const W* weight, const float* bias, float* y,
                   int64_t N, int64_t n_begin, int64_t n_end) {
  for (int64_t n = n_begin; n < n_end; ++n) {
    const W* w = weight + n * K;
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * K;
      float part[16] = {};
      int64_t k = 0;
      for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 16; ++j) part[j] += xm[k + j] * weight_at(w, k + j);
      for (int j = 0; k + j < K; ++j) part[j] += xm[k + j] * weight_at(w, k + j);
      for (int width = 8; width >= 1; width /= 2)
        for (int j = 0; j < width; ++j) part[j] += part[j + width];
      y[m * N + n] = bias == nullptr ? part[0] : part[0] + bias[n];
    }
  }
}

#ifdef SPECDEC_SKINNY_X86
#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512dq,fma")))

// Prefetch distance along a weight row: 2 KiB, a few hundred nanoseconds of DRAM latency ahead of
// the FMAs at this kernel's rate.
constexpr int64_t kPrefetchBytes = 2048;

// 16 weights from w as float32: a float load, or 16 bfloat16 widened (zero-extend, shift left 16).
SPECDEC_AVX512 inline __m512 load16(const float* w) { return _mm512_loadu_ps(w); }
SPECDEC_AVX512 inline __m512 load16(const uint16_t* w) {
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

// NB rows of W against MB rows of x, K % 16 == 0. Per 16 input features: NB loads of W (streamed
// from memory once), then per activation row one load of x (L1 / L2: x is at most 8 * K floats)
// and NB fused multiply-adds. Registers: MB * NB accumulators + NB weights + 1 activation (NB = 4,
// MB = 6: 29 of the 32 zmm registers; NB = 3, MB = 8: 28). The NB * MB independent chains hide
// the FMA latency.
template <int MB, int NB, typename W>
SPECDEC_AVX512 void block_avx512(const float* x, int64_t K, const W* w, const float* bias, float* y,
                                 int64_t N, int64_t n) {
  __m512 acc[MB][NB];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    __m512 wv[NB];
    for (int j = 0; j < NB; ++j) {
      // Each weight row streams from memory once: prefetch it kPrefetchBytes ahead (a prefetch
      // past the row's end reads the next rows, never faults).
      _mm_prefetch(reinterpret_cast<const char*>(w + j * K + k) + kPrefetchBytes, _MM_HINT_T0);
      wv[j] = load16(w + j * K + k);
    }
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_loadu_ps(x + m * K + k);
      for (int j = 0; j < NB; ++j) acc[m][j] = _mm512_fmadd_ps(xv, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) {
      const float s = _mm512_reduce_add_ps(acc[m][j]);
      y[m * N + n + j] = bias == nullptr ? s : s + bias[n + j];
    }
}

// Weight rows per block: 4 up to 6 activation rows, 3 for 7 and 8 (MB * NB + NB + 1 <= 32).
template <int MB, typename W>
SPECDEC_AVX512 void rows_avx512_mb(const float* x, int64_t K, const W* weight, const float* bias, float* y,
                                   int64_t N, int64_t n_begin, int64_t n_end) {
  constexpr int NB = MB <= 6 ? 4 : 3;
  int64_t n = n_begin;
  for (; n + NB <= n_end; n += NB) block_avx512<MB, NB>(x, K, weight + n * K, bias, y, N, n);
  for (; n < n_end; ++n) block_avx512<MB, 1>(x, K, weight + n * K, bias, y, N, n);
}

template <typename W>
void rows_avx512(const float* x, int64_t M, int64_t K, const W* weight, const float* bias, float* y,
                 int64_t N, int64_t n_begin, int64_t n_end) {
  // Blocks of up to kMaxBlockM rows of x; a row's outputs do not depend on its block.
  for (int64_t m0 = 0; m0 < M; m0 += kMaxBlockM) {
    const float* xb = x + m0 * K;
    float* yb = y + m0 * N;
    switch (std::min<int64_t>(kMaxBlockM, M - m0)) {
      case 1: rows_avx512_mb<1>(xb, K, weight, bias, yb, N, n_begin, n_end); break;
      case 2: rows_avx512_mb<2>(xb, K, weight, bias, yb, N, n_begin, n_end); break;
      case 3: rows_avx512_mb<3>(xb, K, weight, bias, yb, N, n_begin, n_end); break;
      case 4: rows_avx512_mb<4>(xb, K, weight, bias, yb, N, n_begin, n_end); break;
      case 5: rows_avx512_mb<5>(xb, K, weight, bias, yb, N, n_begin, n_end); break;
      case 6: rows_avx512_mb<6>(xb, K, weight, bias, yb, N, n_begin, n_end); break;
      case 7: rows_avx512_mb<7>(xb, K, weight, bias, yb, N, n_begin, n_end); break;
      default: rows_avx512_mb<8>(xb, K, weight, bias, yb, N, n_begin, n_end); break;
    }
  }
}

// AVX-512 unless SPECDEC_CPU_ISA caps the ISA below it (kernels/common/cpu_isa.h).
const bool kAvx512 = cpu_avx512_fma_enabled();
#else
const bool kAvx512 = false;
#endif

template <typename W>
void rows(const float* x, int64_t M, int64_t K, const W* weight, const float* bias, float* y, int64_t N,
          int64_t n_begin, int64_t n_end) {
#ifdef SPECDEC_SKINNY_X86
  if (kAvx512 && K % 16 == 0) {
    rows_avx512(x, M, K, weight, bias, y, N, n_begin, n_end);
    return;
  }
#endif
  rows_portable(x, M, K, weight, bias, y, N, n_begin, n_end);
}

}  // namespace

void skinny_linear_cpu_rows(const float* x, int64_t M, int64_t K, const float* weight, const float* bias,
                            float* y, int64_t N, int64_t n_begin, int64_t n_end) {
  rows(x, M, K, weight, bias, y, N, n_begin, n_end);
}

void skinny_linear_cpu_rows_bf16(const float* x, int64_t M, int64_t K, const uint16_t* weight,
                                 const float* bias, float* y, int64_t N, int64_t n_begin, int64_t n_end) {
  rows(x, M, K, weight, bias, y, N, n_begin, n_end);
}

}  // namespace specdec::skinny
