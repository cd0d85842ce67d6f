// e^x for 16 float32 lanes with AVX-512F, for softmax and SiLU in the CPU row kernels (libm's
// scalar expf per element costs more than the rest of a decoding step's attention) and for the
// int4-cache attention (quant_attention_avx512.cpp).
//
// The reduction and polynomial of exp_poly.h (x = n ln2 + r, e^r to r^7), then 2^n applied by
// scalef, which underflows to 0 below 2^-149 and never produces garbage exponents.
// Inputs are clamped to [-104, 88.7] (NaN goes to -104): below, e^x is 0 in float32; above, it
// would overflow. Each lane is a fixed sequence of operations on its own input, so results never
// depend on the neighbouring lanes.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/common/exp_poly.h"

namespace specdec {

__attribute__((target("avx512f,fma"), always_inline)) inline __m512 exp16_avx512(__m512 x) {
  using namespace exp_poly;
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kMin)), _mm512_set1_ps(kMax));
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kHorner[0]);
  for (int i = 1; i <= kDegree; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kHorner[i]));
  return _mm512_scalef_ps(p, n);
}

}  // namespace specdec
#endif
