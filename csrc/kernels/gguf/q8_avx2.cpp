// The AVX2 tier of the Q8-activation GGUF matmul (q8_body.h over V256), compiled for AVX2 through
// a target pragma (a default build targets baseline x86-64; q8_cpu.cpp picks the tier at run time).
// Q4_K against 4 or more rows of x and Q6_K against 2 or more run the lane dots (q8_body.h,
// q8_vec_avx2.h: V256Lanes) over x's codes transposed per call.
#include "kernels/gguf/q8_tiers.h"

#if defined(__x86_64__)
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/gguf/blocks.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

namespace specdec::gguf {
namespace {
#include "kernels/gguf/q8_body.h"
#include "kernels/gguf/q8_vec_avx2.h"
}  // namespace

namespace {

// Rows of x from which Q4_K / Q6_K run their lane dots (V256Lanes): the weights' transpose (24
// shuffles per super-block and tile) must cost less than the reduces it saves. Q6_K's int32 reduce
// is the dearer, so it pays from fewer rows. Set from bench/bench_gguf_compute.py (SPECDEC_Q8_LANE_ROWS
// overrides both, for that measurement).
int64_t lane_dot_min_rows(int32_t type) {
  static const int64_t forced = [] {
    const char* v = std::getenv("SPECDEC_Q8_LANE_ROWS");
    return v != nullptr ? std::atoll(v) : 0;
  }();
  if (forced > 0) return forced;
  return type == 14 ? 2 : 4;
}

// xt [M, 2K] = x's codes with each super-block's 8 x 8 dwords transposed (Q8Args::xt's layout: the
// first 32 bytes of each 64, all that V256 reads; the second copy is the VNNI tier's), K a
// multiple of 256.
void transpose_codes(const Q8Args& a, int64_t M, int8_t* xt) {
  const int64_t T = a.K / kQK_K;
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* q = a.codes(m);
    int8_t* out = xt + m * 2 * a.K;
    for (int64_t t = 0; t < T; ++t) {
      __m256i v[8];
      for (int j = 0; j < 8; ++j) v[j] = V256::xload(q + 256 * t + 32 * j);
      V256::transpose8(v);
      for (int i = 0; i < 8; ++i) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 512 * t + 64 * i), v[i]);
    }
  }
}

}  // namespace

// Up to 8 rows of x per tile: one accumulator per row; the 8 decoded weight vectors of an octet
// and its scale vectors live in L1 (spilled) beside them.
void matmul_q8_rows_avx2(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  if ((type == 12 || type == 14) && M >= lane_dot_min_rows(type)) {
    // Per call (a thread's chunk of rows of W): x's few rows are transposed again, microseconds
    // against the chunk's blocks.
    static thread_local std::vector<int8_t> xt;
    xt.resize(static_cast<size_t>(M * 2 * a.K));
    transpose_codes(a, M, xt.data());
    Q8Args lanes = a;
    lanes.xt = xt.data();
    q8_rows<V256Lanes, 8>(type, lanes, M, n_begin, n_end);
    return;
  }
  q8_rows<V256, 8>(type, a, M, n_begin, n_end);
}

}  // namespace specdec::gguf
#pragma GCC pop_options

#else
namespace specdec::gguf {
void matmul_q8_rows_avx2(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  matmul_q8_rows_portable(type, a, M, n_begin, n_end);
}
}  // namespace specdec::gguf
#endif
