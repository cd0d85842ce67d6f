// The AVX-512 tier of the GGUF matmul: matmul_body.h over V512, which holds two rows of W in one
// zmm register (row n in lanes 0..7, row n + 1 in lanes 8..15). Each half performs exactly the
// AVX2 kernel's operations on its row, so the tiers agree bit for bit; the gain is half the
// instructions per weight (decode, convert, FMA) at M = 1. An odd last row runs the AVX2 code.
//
// Needs AVX-512F (16-lane integer and float ops) and AVX-512DQ (the 256-bit broadcasts, inserts
// and extracts); gguf_cpu.cpp calls it only where cpu_isa.h reports both.
#include "kernels/gguf/matmul_tiers.h"

#if defined(__x86_64__)
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/common/dtype.h"
#include "kernels/gguf/blocks.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx2,fma")
// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized in _mm512_setzero_ps-style helpers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace specdec::gguf {
namespace {
#include "kernels/gguf/matmul_body.h"
#include "kernels/gguf/vec_avx2.h"

struct V512 {
  static constexpr int kRows = 2;
  using F = __m512;
  using I = __m512i;

  SPECDEC_GGUF_INLINE static F zero() { return _mm512_setzero_ps(); }
  SPECDEC_GGUF_INLINE static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  SPECDEC_GGUF_INLINE static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  SPECDEC_GGUF_INLINE static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  SPECDEC_GGUF_INLINE static F add(F a, F b) { return _mm512_add_ps(a, b); }
  // The same 8 activations for both rows.
  SPECDEC_GGUF_INLINE static F x8(const float* p) { return _mm512_broadcast_f32x8(_mm256_loadu_ps(p)); }
  // 8 bytes of row n (at p) and 8 of row n + 1 (at p + stride) -> 16 lanes.
  SPECDEC_GGUF_INLINE static __m128i pair8(const uint8_t* p, int64_t stride) {
    return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)),
                              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + stride)));
  }
  SPECDEC_GGUF_INLINE static I u8x8(const uint8_t* p, int64_t stride) { return _mm512_cvtepu8_epi32(pair8(p, stride)); }
  SPECDEC_GGUF_INLINE static I s8x8(const uint8_t* p, int64_t stride) { return _mm512_cvtepi8_epi32(pair8(p, stride)); }
  SPECDEC_GGUF_INLINE static F rows(const float* v) {
    return _mm512_insertf32x8(_mm512_set1_ps(v[0]), _mm256_set1_ps(v[1]), 1);
  }
  SPECDEC_GGUF_INLINE static I rows_i(const int32_t* v) {
    return _mm512_inserti32x8(_mm512_set1_epi32(v[0]), _mm256_set1_epi32(v[1]), 1);
  }
  SPECDEC_GGUF_INLINE static F lane(F v, int s) {
    return _mm512_permutexvar_ps(_mm512_inserti32x8(_mm512_set1_epi32(s), _mm256_set1_epi32(s + 8), 1), v);
  }
  SPECDEC_GGUF_INLINE static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
  SPECDEC_GGUF_INLINE static I and_(I a, int c) { return _mm512_and_si512(a, _mm512_set1_epi32(c)); }
  SPECDEC_GGUF_INLINE static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  SPECDEC_GGUF_INLINE static I sub(I a, int c) { return _mm512_sub_epi32(a, _mm512_set1_epi32(c)); }
  SPECDEC_GGUF_INLINE static I srli(I a, int n) { return _mm512_srli_epi32(a, static_cast<unsigned>(n)); }
  SPECDEC_GGUF_INLINE static I slli(I a, int n) { return _mm512_slli_epi32(a, static_cast<unsigned>(n)); }
  SPECDEC_GGUF_INLINE static I srlv_lanes(I a, int base) {
    const I j = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7);
    return _mm512_srlv_epi32(a, _mm512_add_epi32(_mm512_set1_epi32(base), j));
  }
  SPECDEC_GGUF_INLINE static void hsum(F v, float* out) {
    out[0] = V256::h8(_mm512_castps512_ps256(v));
    out[1] = V256::h8(_mm512_extractf32x8_ps(v, 1));
  }
};
}  // namespace

// Up to 4 rows of x per tile, as the AVX2 tier (Q4_K: 4 * 4 accumulators + 3 of the 32 zmm).
void matmul_rows_avx512(int32_t type, const MatmulArgs& a, int64_t M, int64_t n_begin, int64_t n_end) {
  const int64_t pairs_end = n_begin + (n_end - n_begin) / 2 * 2;
  gguf_rows<V512, 4>(type, a, M, n_begin, pairs_end);
  if (pairs_end < n_end) gguf_rows<V256, 4>(type, a, M, pairs_end, n_end);
}

}  // namespace specdec::gguf
#pragma GCC pop_options

#else
namespace specdec::gguf {
void matmul_rows_avx512(int32_t type, const MatmulArgs& a, int64_t M, int64_t n_begin, int64_t n_end) {
  matmul_rows_portable(type, a, M, n_begin, n_end);
}
}  // namespace specdec::gguf
#endif
