// The AVX2 + FMA primitives of matmul_body.h: one row of W per ymm register (8 lanes = that row's 8
// accumulator lanes). Included inside an anonymous namespace under `#pragma GCC target("avx2,fma")`
// (or a wider target) by gguf_avx2.cpp and gguf_avx512.cpp (which runs an odd last row with it).
#pragma once

#include <immintrin.h>

#include <cstdint>

struct V256 {
  static constexpr int kRows = 1;
  using F = __m256;
  using I = __m256i;

  SPECDEC_GGUF_INLINE static F zero() { return _mm256_setzero_ps(); }
  SPECDEC_GGUF_INLINE static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  SPECDEC_GGUF_INLINE static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  SPECDEC_GGUF_INLINE static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  SPECDEC_GGUF_INLINE static F add(F a, F b) { return _mm256_add_ps(a, b); }
  SPECDEC_GGUF_INLINE static F x8(const float* p) { return _mm256_loadu_ps(p); }
  SPECDEC_GGUF_INLINE static I u8x8(const uint8_t* p, int64_t) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  SPECDEC_GGUF_INLINE static I s8x8(const uint8_t* p, int64_t) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  SPECDEC_GGUF_INLINE static F rows(const float* v) { return _mm256_set1_ps(v[0]); }
  SPECDEC_GGUF_INLINE static I rows_i(const int32_t* v) { return _mm256_set1_epi32(v[0]); }
  SPECDEC_GGUF_INLINE static F lane(F v, int s) { return _mm256_permutevar8x32_ps(v, _mm256_set1_epi32(s)); }
  SPECDEC_GGUF_INLINE static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
  SPECDEC_GGUF_INLINE static I and_(I a, int c) { return _mm256_and_si256(a, _mm256_set1_epi32(c)); }
  SPECDEC_GGUF_INLINE static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  SPECDEC_GGUF_INLINE static I sub(I a, int c) { return _mm256_sub_epi32(a, _mm256_set1_epi32(c)); }
  SPECDEC_GGUF_INLINE static I srli(I a, int n) { return _mm256_srli_epi32(a, n); }
  SPECDEC_GGUF_INLINE static I slli(I a, int n) { return _mm256_slli_epi32(a, n); }
  SPECDEC_GGUF_INLINE static I srlv_lanes(I a, int base) {
    return _mm256_srlv_epi32(a, _mm256_add_epi32(_mm256_set1_epi32(base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
  }
  // ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)), the order of gguf_cpu.h.
  SPECDEC_GGUF_INLINE static float h8(__m256 v) {
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // v_j + v_j+4
    const __m128 t2 = _mm_add_ps(t, _mm_movehl_ps(t, t));                                  // t0 + t2, t1 + t3
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
  }
  SPECDEC_GGUF_INLINE static void hsum(F v, float* out) { out[0] = h8(v); }
};
