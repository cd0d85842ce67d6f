// The AVX2 primitives of q8_body.h: one row of W per ymm register. Included inside an anonymous
// namespace under `#pragma GCC target("avx2,fma")` (or a wider target) by q8_avx2.cpp and
// q8_avx512.cpp (which runs an odd last row with it).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

// 8 fp16 bit patterns (zero-extended in 32-bit lanes) -> float32, exactly as blocks.h's
// half_to_float (kernels/common/dtype.h): normals rebias the exponent, Inf / NaN keep their
// payload, subnormals are mantissa * 2^-24.
SPECDEC_Q8_INLINE __m256 q8_halves_to_float(__m256i h) {
  const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(h, _mm256_set1_epi32(0x8000)), 16);
  const __m256i em = _mm256_and_si256(h, _mm256_set1_epi32(0x7fff));
  const __m256i exp = _mm256_and_si256(em, _mm256_set1_epi32(0x7c00));
  const __m256i shifted = _mm256_slli_epi32(em, 13);
  const __m256i normal = _mm256_add_epi32(shifted, _mm256_set1_epi32((127 - 15) << 23));
  const __m256i special = _mm256_or_si256(shifted, _mm256_set1_epi32(0x7f800000));
  const __m256i sub = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(em), _mm256_set1_ps(5.9604644775390625e-08f)));
  const __m256i is_special = _mm256_cmpeq_epi32(exp, _mm256_set1_epi32(0x7c00));
  const __m256i is_sub = _mm256_cmpeq_epi32(exp, _mm256_setzero_si256());
  __m256i bits = _mm256_blendv_epi8(normal, special, is_special);
  bits = _mm256_blendv_epi8(bits, sub, is_sub);
  return _mm256_castsi256_ps(_mm256_or_si256(bits, sign));
}

// Lane j < cnt: the uint16 at p + j * step (zero-extended), else 0.
SPECDEC_Q8_INLINE __m256i q8_gather_u16(const uint8_t* p, int64_t step, int cnt) {
  alignas(32) int32_t v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; j < 8; ++j) {
    if (j >= cnt) break;
    uint16_t h;
    std::memcpy(&h, p + j * step, 2);
    v[j] = h;
  }
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
}

// Horizontal reduce of 8 int32 vectors: lane j = sum of m[j]'s lanes (integers: any order is exact).
SPECDEC_Q8_INLINE __m256i q8_reduce8_256(const __m256i* m) {
  // h0123 = [m0 m1 m2 m3 sums of lanes 0..3 | the same of lanes 4..7], h4567 likewise
  const __m256i h0123 = _mm256_hadd_epi32(_mm256_hadd_epi32(m[0], m[1]), _mm256_hadd_epi32(m[2], m[3]));
  const __m256i h4567 = _mm256_hadd_epi32(_mm256_hadd_epi32(m[4], m[5]), _mm256_hadd_epi32(m[6], m[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x21), _mm256_blend_epi32(h0123, h4567, 0xf0));
}

struct V256 {
  static constexpr int kRows = 1;
  using F = __m256;
  using I = __m256i;

  SPECDEC_Q8_INLINE static I wload(const uint8_t* p, int64_t) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  SPECDEC_Q8_INLINE static I wnib16(const uint8_t* p, int64_t) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i m = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
  }
  SPECDEC_Q8_INLINE static I wbit5(const uint8_t* p, int64_t) {
    uint32_t bits;
    std::memcpy(&bits, p, 4);
    // byte i <- byte i / 8 of the word, then test bit i % 8
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(bits)),
                                               _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL,
                                                                  0x0303030303030303LL));
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(16));
  }
  SPECDEC_Q8_INLINE static I xload(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  SPECDEC_Q8_INLINE static I xs16(const int16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  SPECDEC_Q8_INLINE static F xf(const float* p) { return _mm256_loadu_ps(p); }
  SPECDEC_Q8_INLINE static I and8(I a, int c) { return _mm256_and_si256(a, _mm256_set1_epi8(static_cast<char>(c))); }
  SPECDEC_Q8_INLINE static I or_(I a, I b) { return _mm256_or_si256(a, b); }
  SPECDEC_Q8_INLINE static I srli16(I a, int n) { return _mm256_srli_epi16(a, n); }
  SPECDEC_Q8_INLINE static I slli16(I a, int n) { return _mm256_slli_epi16(a, n); }
  SPECDEC_Q8_INLINE static I slli32(I a, int n) { return _mm256_slli_epi32(a, n); }
  SPECDEC_Q8_INLINE static I sub32(I a, I b) { return _mm256_sub_epi32(a, b); }
  SPECDEC_Q8_INLINE static I maddubs(I u, I s) { return _mm256_maddubs_epi16(u, s); }
  SPECDEC_Q8_INLINE static I madd(I a, I b) { return _mm256_madd_epi16(a, b); }
  SPECDEC_Q8_INLINE static I ones16() { return _mm256_set1_epi16(1); }
  SPECDEC_Q8_INLINE static I izero() { return _mm256_setzero_si256(); }
  SPECDEC_Q8_INLINE static I abs8(I a) { return _mm256_abs_epi8(a); }
  SPECDEC_Q8_INLINE static I sign8(I x, I w) { return _mm256_sign_epi8(x, w); }
  SPECDEC_Q8_INLINE static I reduce8(const I* m) { return q8_reduce8_256(m); }
  SPECDEC_Q8_INLINE static I bcast16(const uint64_t* b, int s) {
    return _mm256_set1_epi16(static_cast<int16_t>((b[0] >> (8 * s)) & 0xff));
  }
  SPECDEC_Q8_INLINE static I pairs16(const uint64_t* b) {
    const __m128i v = _mm_cvtsi64_si128(static_cast<int64_t>(b[0]));
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(v, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)));
  }
  SPECDEC_Q8_INLINE static I q6_scales(const uint8_t* p, int64_t) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  SPECDEC_Q8_INLINE static I q6_pair(I sc16, int g) {
    // dword g = (sc_2g, sc_2g+1) everywhere, then word 0 across the low half, word 1 the high half
    const __m256i pair = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(g));
    return _mm256_shuffle_epi8(pair, _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,
                                                      2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
  }
  SPECDEC_Q8_INLINE static F halves8(const uint8_t* p, int64_t step, int64_t, int cnt) {
    return q8_halves_to_float(q8_gather_u16(p, step, cnt));
  }
  SPECDEC_Q8_INLINE static F rows_f(const float* v) { return _mm256_set1_ps(v[0]); }
  SPECDEC_Q8_INLINE static F zero() { return _mm256_setzero_ps(); }
  SPECDEC_Q8_INLINE static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
  SPECDEC_Q8_INLINE static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  SPECDEC_Q8_INLINE static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  SPECDEC_Q8_INLINE static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  // ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)), q8.h's order.
  SPECDEC_Q8_INLINE static float h8(__m256 v) {
    const __m128 t = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t2 = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
  }
  SPECDEC_Q8_INLINE static void hsum(F v, float* out) { out[0] = h8(v); }
};
