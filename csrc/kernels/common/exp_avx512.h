// e^x for 16 float32 lanes with AVX-512F, for softmax and SiLU in the CPU row kernels (libm's
// scalar expf per element costs more than the rest of a decoding step's attention) and for the
// int4-cache attention (quant_attention_avx512.cpp).
//
// x = n ln2 + r with n = round(x / ln2) and |r| <= ln2 / 2 (ln2 split in two, its high part short
// enough that n * hi is exact), e^r by its Taylor series to r^7 (relative error below 2e-7 there),
// 2^n applied by scalef, which underflows to 0 below 2^-149 and never produces garbage exponents.
// Inputs are clamped to [-104, 88.7] (NaN goes to -104): below, e^x is 0 in float32; above, it
// would overflow. Each lane is a fixed sequence of operations on its own input, so results never
// depend on the neighbouring lanes.
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace specdec {

__attribute__((target("avx512f,fma"), always_inline)) inline __m512 exp16_avx512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-104.0f)), _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln2's high bits
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);   // ln2 - hi
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace specdec
#endif
