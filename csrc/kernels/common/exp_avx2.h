// e^x for 8 float32 lanes with AVX2 + FMA, for softmax and SiLU in the CPU row kernels on machines
// without AVX-512 (exp_avx512.h is the 16-lane form; libm's scalar expf per element would cost
// more than the rest of a decoding step's attention).
//
// The reduction and polynomial of exp_poly.h, as exp16_avx512 (x = n ln2 + r, e^r to r^7). AVX2
// has no scalef, so 2^n is applied as two exact powers of two, 2^(n - h) * 2^h with h = floor(n / 2): both stay normal
// floats for n in [-150, 128], and the second product underflows to 0 or a denormal as IEEE
// rounding gives, never producing garbage exponents. Inputs are clamped to [-104, 88.7] (NaN goes
// to -104). Each lane is a fixed sequence of operations on its own input.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/common/exp_poly.h"

namespace specdec {

__attribute__((target("avx2,fma"), always_inline)) inline __m256 exp8_avx2(__m256 x) {
  using namespace exp_poly;
  // max(x, lo) returns lo when x is NaN (the second operand wins on an unordered compare).
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kMin)), _mm256_set1_ps(kMax));
  const __m256 n =
      _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kHorner[0]);
  for (int i = 1; i <= kDegree; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kHorner[i]));
  // 2^n = 2^(n - h) * 2^h, h = floor(n / 2) (arithmetic shift); exponent fields (e + 127) << 23.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i h = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 scale_hi = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), bias), 23));
  const __m256 scale_lo = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, scale_hi), scale_lo);
}

}  // namespace specdec
#endif
