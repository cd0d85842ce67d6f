// 16 float32 -> 16 bfloat16 bits rounded to nearest even (finite inputs), AVX-512 F + BW: what
// dtype.h's to_bf16_bits does to one value, without its NaN case. For translation units compiled
// (or pragma-targeted) for AVX-512: include it inside the target region.
#pragma once

#include <immintrin.h>

inline __m256i round_bf16_avx512(__m512 f) {
  const __m512i b = _mm512_castps_si512(f);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}
