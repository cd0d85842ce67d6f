// The AVX2 primitives of q8_body.h: one row of W per ymm register. Included inside an anonymous
// namespace under `#pragma GCC target("avx2,fma,f16c")` (or a wider target) by q8_avx2.cpp and
// q8_avx512.cpp (which runs an odd last row with it).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

// Lane j < cnt: the fp16 bits at p + j * step, else 0.
SPECDEC_Q8_INLINE __m128i q8_halves8_bits(const uint8_t* p, int64_t step, int cnt) {
  // The 8 halves gathered with scalar loads into two 64-bit words (integer ports), then one
  // vmovq / vpinsrq pair: inserting them word by word (vpinsrw) costs 8 vector shuffles per octet.
  uint64_t w[2] = {0, 0};
  if (cnt == 8) {
    for (int j = 0; j < 8; ++j) {
      uint16_t v;
      std::memcpy(&v, p + j * step, 2);
      w[j >> 2] |= static_cast<uint64_t>(v) << (16 * (j & 3));
    }
  } else {
    for (int j = 0; j < cnt; ++j) {
      uint16_t v;
      std::memcpy(&v, p + j * step, 2);
      w[j >> 2] |= static_cast<uint64_t>(v) << (16 * (j & 3));
    }
  }
  return _mm_insert_epi64(_mm_cvtsi64_si128(static_cast<int64_t>(w[0])), static_cast<int64_t>(w[1]), 1);
}

// Lane j < cnt: the fp16 at p + j * step widened (F16C: exact, as blocks.h's half_to_float for
// every finite or infinite value), else 0.
SPECDEC_Q8_INLINE __m256 q8_halves8(const uint8_t* p, int64_t step, int cnt) {
  return _mm256_cvtph_ps(q8_halves8_bits(p, step, cnt));
}

// Horizontal reduce of 8 int32 vectors: lane j = sum of m[j]'s lanes (integers: any order is
// exact). Unpacks and adds rather than vphaddd, which Zen 3 runs as several uops per instruction.
SPECDEC_Q8_INLINE __m256i q8_pair_sums(__m256i a, __m256i b) {
  // [a0+a2, b0+b2, a1+a3, b1+b3 | the same of lanes 4..7]
  return _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
}
SPECDEC_Q8_INLINE __m256i q8_quad_sums(__m256i ab, __m256i cd) {
  // [a, b, c, d sums of lanes 0..3 | of lanes 4..7]
  return _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
}
SPECDEC_Q8_INLINE __m256i q8_reduce8_256(const __m256i* m) {
  const __m256i h0123 = q8_quad_sums(q8_pair_sums(m[0], m[1]), q8_pair_sums(m[2], m[3]));
  const __m256i h4567 = q8_quad_sums(q8_pair_sums(m[4], m[5]), q8_pair_sums(m[6], m[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x21), _mm256_blend_epi32(h0123, h4567, 0xf0));
}

// Q6_K's scaled reduce, from 8 vectors of 8 int32 (lanes 0..3: partial sums over group j's first
// 16 values, lanes 4..7: over its last 16): lane j = s[2j] * (sum of m[j]'s lanes 0..3) + s[2j + 1]
// * (sum of its lanes 4..7), the scales applied to the half sums before the two halves meet, as
// ``s0123`` = [s0 s2 s4 s6 | s1 s3 s5 s7], ``s4567`` = [s8 s10 s12 s14 | s9 s11 s13 s15] (int32;
// q8_q6_half_scales). Exact: |products| < 2^24.
SPECDEC_Q8_INLINE __m256i q8_reduce8_halves_256(const __m256i* m, __m256i s0123, __m256i s4567) {
  const __m256i h0123 = _mm256_mullo_epi32(q8_quad_sums(q8_pair_sums(m[0], m[1]), q8_pair_sums(m[2], m[3])), s0123);
  const __m256i h4567 = _mm256_mullo_epi32(q8_quad_sums(q8_pair_sums(m[4], m[5]), q8_pair_sums(m[6], m[7])), s4567);
  return _mm256_add_epi32(_mm256_permute2x128_si256(h0123, h4567, 0x21), _mm256_blend_epi32(h0123, h4567, 0xf0));
}
SPECDEC_Q8_INLINE void q8_q6_half_scales(const uint8_t* p, __m256i& s0123, __m256i& s4567) {
  const __m128i b = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)),
                                     _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15));
  s0123 = _mm256_cvtepi8_epi32(b);
  s4567 = _mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b));
}

// The same reduce from 8 vectors of 16 int16 (maddubs outputs), times an int16 factor per lane:
// lane j = c_j * (the sum of p[j]'s words), with c = pairs [c0 c0 c1 c1 .. c7 c7] (Q4_K's scales,
// or ones). For codes whose sums of 8 words fit an int16 (4-bit weights: 16 * 15 * 127 = 30480):
// three levels of int16 unpack-adds, then one vpmaddwd that adds the two 128-bit halves' sums and
// multiplies, instead of a vpmaddwd per vector and an int32 tree.
SPECDEC_Q8_INLINE __m256i q8_pair16(__m256i a, __m256i b) {  // [a0+a4, b0+b4, a1+a5, b1+b5, ...] per 128 bits
  return _mm256_add_epi16(_mm256_unpacklo_epi16(a, b), _mm256_unpackhi_epi16(a, b));
}
SPECDEC_Q8_INLINE __m256i q8_quad16(__m256i ab, __m256i cd) {  // [a, b, c, d of words 0246 | of 1357]
  return _mm256_add_epi16(_mm256_unpacklo_epi32(ab, cd), _mm256_unpackhi_epi32(ab, cd));
}
SPECDEC_Q8_INLINE __m256i q8_reduce8_i16_256(const __m256i* p, __m256i c) {
  const __m256i abcd = q8_quad16(q8_pair16(p[0], p[1]), q8_pair16(p[2], p[3]));
  const __m256i efgh = q8_quad16(q8_pair16(p[4], p[5]), q8_pair16(p[6], p[7]));
  // words j = 0..7 of the low 128 bits: p[j]'s sum over its low half (bytes 0..15); of the high
  // 128 bits: over its high half
  const __m256i v = _mm256_add_epi16(_mm256_unpacklo_epi64(abcd, efgh), _mm256_unpackhi_epi64(abcd, efgh));
  // -> dword j = (low-half sum, high-half sum) of p[j]: qwords lo0 hi0 | lo1 hi1, then interleave
  const __m256i t = _mm256_permute4x64_epi64(v, 0xd8);
  const __m256i u = _mm256_shuffle_epi8(t, _mm256_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15,
                                                            0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15));
  return _mm256_madd_epi16(u, c);
}

struct V256 {
  static constexpr int kRows = 1;
  // The reduce runs; V256Lanes (below) runs the Q4_K / Q6_K lane dots instead.
  static constexpr bool kLaneDots = false;
  using F = __m256;
  using I = __m256i;

  SPECDEC_Q8_INLINE static I wload(const uint8_t* p, int64_t) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  SPECDEC_Q8_INLINE static I wnib16(const uint8_t* p, int64_t) {
    // the 16 bytes in both halves (a broadcast load, no shuffle), the high half shifted by 4
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
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
  SPECDEC_Q8_INLINE static I dot4(I u, I s) { return madd(maddubs(u, s), ones16()); }
  SPECDEC_Q8_INLINE static I izero() { return _mm256_setzero_si256(); }
  SPECDEC_Q8_INLINE static I abs8(I a) { return _mm256_abs_epi8(a); }
  SPECDEC_Q8_INLINE static I sign8(I x, I w) { return _mm256_sign_epi8(x, w); }
  // ---- the Q4_K / Q6_K lane dots (q8_body.h) --------------------------------------------------
  // x's transposed codes: the first of the two copies of each 32-byte chunk (Q8Args::xt)
  SPECDEC_Q8_INLINE static I xtload(const int8_t* p) { return xload(p); }
  // The 8 x 8 dword transpose: on return w[i] lane j = dword i of the w[j] given.
  SPECDEC_Q8_INLINE static void transpose8(I* w) {
    I t[8], u[8];
    for (int k = 0; k < 8; k += 2) {
      t[k] = _mm256_unpacklo_epi32(w[k], w[k + 1]);
      t[k + 1] = _mm256_unpackhi_epi32(w[k], w[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
      u[k] = _mm256_unpacklo_epi64(t[k], t[k + 2]);          // dwords 0, 4 of w[k .. k + 3]
      u[k + 1] = _mm256_unpackhi_epi64(t[k], t[k + 2]);      // 1, 5
      u[k + 2] = _mm256_unpacklo_epi64(t[k + 1], t[k + 3]);  // 2, 6
      u[k + 3] = _mm256_unpackhi_epi64(t[k + 1], t[k + 3]);  // 3, 7
    }
    for (int k = 0; k < 4; ++k) {
      w[k] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x20);
      w[k + 4] = _mm256_permute2x128_si256(u[k], u[4 + k], 0x31);
    }
  }
  // Q4_K: w[i] lane j holds 4 codes (0..15) of sub-block j, so a vpmaddubsw's two int16 words in
  // dword j are partial sums of sub-block j (each <= 2 * 15 * 127 in magnitude); the 8 registers'
  // words add in int16 (<= 30480, no wrap) and one vpmaddwd by [sc_j, sc_j] per dword multiplies
  // and adds each pair: lane j = sc_j Σ w q, exactly.
  SPECDEC_Q8_INLINE static I q4_lane_scales(const uint64_t* b) { return pairs16(b); }
  SPECDEC_Q8_INLINE static I q4_lane_dot(const I* w, const int8_t* q, I scales) {
    I acc = maddubs(w[0], xtload(q));
    SPECDEC_Q8_UNROLL
    for (int i = 1; i < 8; ++i) acc = _mm256_add_epi16(acc, maddubs(w[i], xtload(q + 64 * i)));
    return madd(acc, scales);
  }
  // Q6_K: codes w + 32 in 0..63, so a word is <= 2 * 63 * 127 = 16002 and two registers' words
  // add in int16 (<= 32004); each pair of registers then meets its scale in one vpmaddwd:
  // lo / hi = [sc_2j, sc_2j] / [sc_2j+1, sc_2j+1] per dword j (int16).
  SPECDEC_Q8_INLINE static void q6_lane_scales(const uint8_t* p, int64_t, I& lo, I& hi) {
    const __m128i s = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    lo = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s, _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14)));
    hi = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(s, _mm_setr_epi8(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15)));
  }
  SPECDEC_Q8_INLINE static I q6_lane_sums(const I* w, const int8_t* q, I s_first, I s_last) {
    I part[4];
    SPECDEC_Q8_UNROLL
    for (int k = 0; k < 4; ++k)
      part[k] = _mm256_add_epi16(maddubs(w[2 * k], xtload(q + 128 * k)), maddubs(w[2 * k + 1], xtload(q + 128 * k + 64)));
    return _mm256_add_epi32(_mm256_add_epi32(madd(part[0], s_first), madd(part[1], s_first)),
                            _mm256_add_epi32(madd(part[2], s_last), madd(part[3], s_last)));
  }

  SPECDEC_Q8_INLINE static I reduce8(const I* m) { return q8_reduce8_256(m); }
  SPECDEC_Q8_INLINE static I reduce8_i16(const I* p, I c) { return q8_reduce8_i16_256(p, c); }
  SPECDEC_Q8_INLINE static I pairs16(const uint64_t* b) {
    const __m128i v = _mm_cvtsi64_si128(static_cast<int64_t>(b[0]));
    return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(v, _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7)));
  }
  SPECDEC_Q8_INLINE static I q6_scales(const uint8_t* p, int64_t) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  SPECDEC_Q8_INLINE static void q6_half_scales(const uint8_t* p, int64_t, I& s0123, I& s4567) {
    q8_q6_half_scales(p, s0123, s4567);
  }
  SPECDEC_Q8_INLINE static I reduce8_halves(const I* m, I s0123, I s4567) {
    return q8_reduce8_halves_256(m, s0123, s4567);
  }
  SPECDEC_Q8_INLINE static F halves8(const uint8_t* p, int64_t step, int64_t, int cnt) {
    return q8_halves8(p, step, cnt);
  }
  SPECDEC_Q8_INLINE static F rows_f(const float* v) { return _mm256_set1_ps(v[0]); }
  SPECDEC_Q8_INLINE static float h2f(uint16_t h) { return _cvtsh_ss(h); }
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

// V256 with the Q4_K / Q6_K lane dots (q8_body.h) where the caller transposed x's codes
// (Q8Args::xt, q8_avx2.cpp): int16 sums of vpmaddubsw, then one vpmaddwd by the scales, in place of
// the reduce's ~20 shuffles and adds per row of x. A type of its own, so that the tiles that reduce
// compile as they did without it.
struct V256Lanes : V256 {
  static constexpr bool kLaneDots = true;
};
