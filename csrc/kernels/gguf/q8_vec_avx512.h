// The AVX-512 primitives of q8_body.h: two rows of W per zmm register, row n in the low 256 bits
// and row n + 1 in the high 256 (the split gguf_avx512.cpp's V512 uses). A decoded octet of W then
// serves two output rows per instruction, which halves the instructions per weight and per row of
// x: what bounds a verification forward, whose extra rows cost compute, not memory.
//
// Same bits as the AVX2 tier by construction. Every AVX2 step that works within a 128-bit lane
// (byte shuffles, unpacks, vpmaddubsw / vpmaddwd, shifts) runs here on each 128-bit lane alike, so
// each 256-bit half holds exactly the AVX2 kernel's integers for its row; the few AVX2 steps that
// cross 128-bit lanes (the last step of the reduces, the widening of the scales, the broadcasts
// of x) are rebuilt per 256-bit half; the float steps are the same lane-wise operations.
//
// kVnni: dot4 (the int32 sums of 4 adjacent u8 x s8 products) is one vpdpbusd instead of
// vpmaddubsw + vpmaddwd by ones. The integers are equal because no int16 pair sum of q8_body.h's
// formats can saturate (each format's bound is given there).
//
// Included by q8_avx512.cpp and q8_avx512_vnni.cpp inside an anonymous namespace, after
// q8_vec_avx2.h (an odd last row of W runs V256, whose helpers this reuses), under target pragmas
// with AVX-512 F / BW / VL / DQ (and VNNI for the VNNI instantiation).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

template <bool kVnni>
struct V512Q8 {
  static constexpr int kRows = 2;
  // Q4_K / Q6_K lane dots (q8_body.h) where vpdpbusd accumulates: lane (row r, sub-block j)
  // sums its 32 products over 8 vpdpbusd, so no per-row reduce runs.
  static constexpr bool kLaneDots = kVnni;
  using F = __m512;
  using I = __m512i;

  // ---- building a register from two rows' 256-bit halves --------------------------------------
  SPECDEC_Q8_INLINE static I two(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  SPECDEC_Q8_INLINE static __m256i load256(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  SPECDEC_Q8_INLINE static __m128i load128(const uint8_t* p) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  }

  // ---- weights: row n at p, row n + 1 at p + st -----------------------------------------------
  SPECDEC_Q8_INLINE static I wload(const uint8_t* p, int64_t st) { return two(load256(p), load256(p + st)); }
  SPECDEC_Q8_INLINE static I wnib16(const uint8_t* p, int64_t st) {
    // per row: its 16 bytes in both 128-bit lanes, the high lane shifted by 4 (V256::wnib16)
    const I b = two(_mm256_broadcastsi128_si256(load128(p)), _mm256_broadcastsi128_si256(load128(p + st)));
    return _mm512_and_si512(_mm512_srlv_epi64(b, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0)), _mm512_set1_epi8(15));
  }
  SPECDEC_Q8_INLINE static I wbit5(const uint8_t* p, int64_t st) {
    // byte i of row r is in mask bit 32 r + i: the two rows' words are the byte mask itself
    uint32_t b0, b1;
    std::memcpy(&b0, p, 4);
    std::memcpy(&b1, p + st, 4);
    const __mmask64 set = _cvtu64_mask64(static_cast<uint64_t>(b0) | static_cast<uint64_t>(b1) << 32);
    return _mm512_maskz_mov_epi8(set, _mm512_set1_epi8(16));
  }

  // ---- activations: the same 32 bytes / 16 sums / 8 scales for both rows ----------------------
  SPECDEC_Q8_INLINE static I xload(const int8_t* p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // 32 codes of x stored twice over (Q8Args::xt, the lane dots' transposed codes; Q8Args::xd): one
  // 64-byte load, which vpdpbusd takes as its memory operand, instead of a 32-byte broadcast
  SPECDEC_Q8_INLINE static I xtload(const int8_t* p) { return _mm512_loadu_si512(p); }
  SPECDEC_Q8_INLINE static I xs16(const int16_t* p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  SPECDEC_Q8_INLINE static F xf(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }

  // ---- lane-wise integer steps ------------------------------------------------------------------
  SPECDEC_Q8_INLINE static I and8(I a, int c) { return _mm512_and_si512(a, _mm512_set1_epi8(static_cast<char>(c))); }
  SPECDEC_Q8_INLINE static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  SPECDEC_Q8_INLINE static I srli16(I a, int n) { return _mm512_srli_epi16(a, static_cast<unsigned>(n)); }
  SPECDEC_Q8_INLINE static I slli16(I a, int n) { return _mm512_slli_epi16(a, static_cast<unsigned>(n)); }
  SPECDEC_Q8_INLINE static I slli32(I a, int n) { return _mm512_slli_epi32(a, static_cast<unsigned>(n)); }
  SPECDEC_Q8_INLINE static I sub32(I a, I b) { return _mm512_sub_epi32(a, b); }
  SPECDEC_Q8_INLINE static I add32(I a, I b) { return _mm512_add_epi32(a, b); }
  SPECDEC_Q8_INLINE static I maddubs(I u, I s) { return _mm512_maddubs_epi16(u, s); }
  SPECDEC_Q8_INLINE static I madd(I a, I b) { return _mm512_madd_epi16(a, b); }
  SPECDEC_Q8_INLINE static I ones16() { return _mm512_set1_epi16(1); }
  SPECDEC_Q8_INLINE static I dot4(I u, I s) {
    if constexpr (kVnni) {
      return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
    } else {
      return madd(maddubs(u, s), ones16());
    }
  }
  SPECDEC_Q8_INLINE static I izero() { return _mm512_setzero_si512(); }
  SPECDEC_Q8_INLINE static I dpbusd(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
  SPECDEC_Q8_INLINE static I mullo32(I a, I b) { return _mm512_mullo_epi32(a, b); }
  // lane (r, j) = byte j of b[r], as int32
  SPECDEC_Q8_INLINE static I bytes32(const uint64_t* b) {
    return _mm512_cvtepu8_epi32(_mm_set_epi64x(static_cast<int64_t>(b[1]), static_cast<int64_t>(b[0])));
  }

  // ---- the Q4_K / Q6_K lane dots (q8_body.h): 8 vpdpbusd per row of x, int32 throughout --------
  SPECDEC_Q8_INLINE static I q4_lane_scales(const uint64_t* b) { return bytes32(b); }
  SPECDEC_Q8_INLINE static I q4_lane_dot(const I* w, const int8_t* q, I scales) {
    I acc = izero();
    SPECDEC_Q8_UNROLL
    for (int i = 0; i < 8; ++i) acc = dpbusd(acc, w[i], xtload(q + 64 * i));
    return mullo32(acc, scales);
  }
  SPECDEC_Q8_INLINE static I q6_lane_sums(const I* w, const int8_t* q, I s_first, I s_last) {
    I lo = izero(), hi = izero();
    SPECDEC_Q8_UNROLL
    for (int i = 0; i < 4; ++i) {
      lo = dpbusd(lo, w[i], xtload(q + 64 * i));
      hi = dpbusd(hi, w[4 + i], xtload(q + 64 * (4 + i)));
    }
    return add32(mullo32(lo, s_first), mullo32(hi, s_last));
  }
  // Q8_0's codes made unsigned for vpdpbusd: w + 128 (the 128 comes off through x's sums).
  SPECDEC_Q8_INLINE static I flip8(I w) { return _mm512_xor_si512(w, _mm512_set1_epi8(static_cast<char>(0x80))); }
  // The legacy formats' lane dots (q8_body.h, octet_body<kType, true>): lane (r, j) = Σ w q over
  // block j of the octet, from the transposed weights w[8] (unsigned codes) and x's transposed
  // codes at q.
  SPECDEC_Q8_INLINE static I legacy_lane_dot(const I* w, const int8_t* q) {
    I acc = izero();
    SPECDEC_Q8_UNROLL
    for (int i = 0; i < 8; ++i) acc = dpbusd(acc, w[i], xtload(q + 64 * i));
    return acc;
  }
  // Per 256-bit half (one row of W), the 8 x 8 dword transpose: on return w[i] lane j = dword i of
  // the w[j] given (8 unpacks of dwords, 8 of qwords, 8 two-source permutes of 128-bit pairs).
  SPECDEC_Q8_INLINE static void transpose8(I* w) {
    I t[8], u[8];
    for (int k = 0; k < 8; k += 2) {
      t[k] = _mm512_unpacklo_epi32(w[k], w[k + 1]);
      t[k + 1] = _mm512_unpackhi_epi32(w[k], w[k + 1]);
    }
    for (int k = 0; k < 8; k += 4) {
      u[k] = _mm512_unpacklo_epi64(t[k], t[k + 2]);      // dwords 0, 4 of w[k .. k + 3]
      u[k + 1] = _mm512_unpackhi_epi64(t[k], t[k + 2]);  // 1, 5
      u[k + 2] = _mm512_unpacklo_epi64(t[k + 1], t[k + 3]);  // 2, 6
      u[k + 3] = _mm512_unpackhi_epi64(t[k + 1], t[k + 3]);  // 3, 7
    }
    const I lo = _mm512_set_epi64(13, 12, 5, 4, 9, 8, 1, 0), hi = _mm512_set_epi64(15, 14, 7, 6, 11, 10, 3, 2);
    for (int k = 0; k < 4; ++k) {
      w[k] = _mm512_permutex2var_epi64(u[k], lo, u[4 + k]);
      w[k + 4] = _mm512_permutex2var_epi64(u[k], hi, u[4 + k]);
    }
  }
  SPECDEC_Q8_INLINE static I abs8(I a) { return _mm512_abs_epi8(a); }
  // Q8_0's sign step: compiled with the body's Q8_0 loop, which q8_rows_avx512 never runs (it
  // sends Q8_0 to V256, where vpsignb is one instruction).
  SPECDEC_Q8_INLINE static I sign8(I x, I w) {
    // vpsignb has no 512-bit form: x where w > 0, -x (wrapping) where w < 0, 0 where w == 0
    const I neg = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
    return _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(w, w), neg);
  }

  // ---- reduces (V256's, with its one cross-lane step rebuilt per 256-bit half) ------------------
  // V256: add(permute2x128(h0123, h4567, 0x21), blend_epi32(h0123, h4567, 0xf0)), per half.
  SPECDEC_Q8_INLINE static I join_halves(I h0123, I h4567) {
    const I cross = _mm512_permutex2var_epi64(h0123, _mm512_set_epi64(13, 12, 7, 6, 9, 8, 3, 2), h4567);
    return _mm512_add_epi32(cross, _mm512_mask_blend_epi32(0xF0F0, h0123, h4567));
  }
  SPECDEC_Q8_INLINE static I pair_sums(I a, I b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  }
  SPECDEC_Q8_INLINE static I quad_sums(I ab, I cd) {
    return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  }
  SPECDEC_Q8_INLINE static I reduce8(const I* m) {
    return join_halves(quad_sums(pair_sums(m[0], m[1]), pair_sums(m[2], m[3])),
                       quad_sums(pair_sums(m[4], m[5]), pair_sums(m[6], m[7])));
  }
  SPECDEC_Q8_INLINE static I reduce8_halves(const I* m, I s0123, I s4567) {
    return join_halves(_mm512_mullo_epi32(quad_sums(pair_sums(m[0], m[1]), pair_sums(m[2], m[3])), s0123),
                       _mm512_mullo_epi32(quad_sums(pair_sums(m[4], m[5]), pair_sums(m[6], m[7])), s4567));
  }
  SPECDEC_Q8_INLINE static I pair16(I a, I b) {
    return _mm512_add_epi16(_mm512_unpacklo_epi16(a, b), _mm512_unpackhi_epi16(a, b));
  }
  SPECDEC_Q8_INLINE static I quad16(I ab, I cd) {
    return _mm512_add_epi16(_mm512_unpacklo_epi32(ab, cd), _mm512_unpackhi_epi32(ab, cd));
  }
  SPECDEC_Q8_INLINE static I reduce8_i16(const I* p, I c) {
    const I abcd = quad16(pair16(p[0], p[1]), pair16(p[2], p[3]));
    const I efgh = quad16(pair16(p[4], p[5]), pair16(p[6], p[7]));
    const I v = _mm512_add_epi16(_mm512_unpacklo_epi64(abcd, efgh), _mm512_unpackhi_epi64(abcd, efgh));
    const I t = _mm512_permutex_epi64(v, 0xd8);  // vpermq within each 256-bit half, as V256's
    const I u = _mm512_shuffle_epi8(
        t, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 8, 9, 2, 3, 10, 11, 4, 5, 12, 13, 6, 7, 14, 15)));
    return _mm512_madd_epi16(u, c);
  }

  // ---- per-row factors ------------------------------------------------------------------------
  SPECDEC_Q8_INLINE static I pairs16(const uint64_t* b) {
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m128i lo = _mm_shuffle_epi8(_mm_cvtsi64_si128(static_cast<int64_t>(b[0])), dup);
    const __m128i hi = _mm_shuffle_epi8(_mm_cvtsi64_si128(static_cast<int64_t>(b[1])), dup);
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(hi, lo));
  }
  SPECDEC_Q8_INLINE static I q6_scales(const uint8_t* p, int64_t st) {
    return _mm512_cvtepi8_epi16(_mm256_set_m128i(load128(p + st), load128(p)));
  }
  SPECDEC_Q8_INLINE static void q6_half_scales(const uint8_t* p, int64_t st, I& s0123, I& s4567) {
    const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
    const __m128i b0 = _mm_shuffle_epi8(load128(p), order), b1 = _mm_shuffle_epi8(load128(p + st), order);
    s0123 = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(b0, b1));
    s4567 = _mm512_cvtepi8_epi32(_mm_unpackhi_epi64(b0, b1));
  }
  // Q6_K's lane dots: lo lane (r, j) = scale 2j of row r (its sub-block j's first 16 codes), hi
  // lane (r, j) = scale 2j + 1, as int32.
  SPECDEC_Q8_INLINE static void q6_lane_scales(const uint8_t* p, int64_t st, I& lo, I& hi) {
    const __m128i order = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m128i b0 = _mm_shuffle_epi8(load128(p), order), b1 = _mm_shuffle_epi8(load128(p + st), order);
    lo = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(b0, b1));
    hi = _mm512_cvtepi8_epi32(_mm_unpackhi_epi64(b0, b1));
  }
  SPECDEC_Q8_INLINE static F halves8(const uint8_t* p, int64_t step, int64_t st, int cnt) {
    return _mm512_cvtph_ps(_mm256_set_m128i(q8_halves8_bits(p + st, step, cnt), q8_halves8_bits(p, step, cnt)));
  }
  SPECDEC_Q8_INLINE static F rows_f(const float* v) {
    return _mm512_insertf32x8(_mm512_set1_ps(v[0]), _mm256_set1_ps(v[1]), 1);
  }
  SPECDEC_Q8_INLINE static float h2f(uint16_t h) { return _cvtsh_ss(h); }

  // ---- float steps ------------------------------------------------------------------------------
  SPECDEC_Q8_INLINE static F zero() { return _mm512_setzero_ps(); }
  SPECDEC_Q8_INLINE static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  SPECDEC_Q8_INLINE static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  SPECDEC_Q8_INLINE static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  SPECDEC_Q8_INLINE static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  SPECDEC_Q8_INLINE static void hsum(F v, float* out) {
    out[0] = V256::h8(_mm512_castps512_ps256(v));
    out[1] = V256::h8(_mm512_extractf32x8_ps(v, 1));
  }
};

// Rows [n_begin, n_end) of y: pairs of rows of W over V512Q8, an odd last row over V256; Q8_0 all
// over V256 (512-bit vpsignb does not exist, and its three-op stand-in made Q8_0 slower than the
// AVX2 tier: 12.1-12.7 against 11.1 ns per 256 weights at one row, bench/bench_gguf_compute.py),
// but where the VNNI tier's lane dots run (x's codes transposed: q8_body.h), which need no sign step.
// Up to 8 rows of x per tile, as the AVX2 tier.
template <bool kVnni>
void q8_rows_avx512(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  if (type == 8 && !(kVnni && a.xt != nullptr)) {  // with x transposed: the lane dots, no vpsignb
    q8_rows<V256, 8>(type, a, M, n_begin, n_end);
    return;
  }
  const int64_t pairs_end = n_begin + (n_end - n_begin) / 2 * 2;
  q8_rows<V512Q8<kVnni>, 8>(type, a, M, n_begin, pairs_end);
  if (pairs_end < n_end) q8_rows<V256, 8>(type, a, M, pairs_end, n_end);
}
