// The AVX-512 + VNNI tier of the Q8-activation GGUF matmul: q8_avx512.cpp's kernel with the sums of
// 4 adjacent u8 x s8 products (Q6_K, Q5_0) in one vpdpbusd instead of vpmaddubsw + vpmaddwd. The
// integers, hence the bits, are those of the other tiers (q8_vec_avx512.h).
#include "kernels/gguf/q8_tiers.h"

#if defined(__x86_64__)
#include <cstdint>
#include <cstring>

#include "kernels/common/dtype.h"
#include "kernels/gguf/blocks.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized in _mm512_setzero_ps-style helpers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace specdec::gguf {
namespace {
#include "kernels/gguf/q8_body.h"
#include "kernels/gguf/q8_vec_avx2.h"
#include "kernels/gguf/q8_vec_avx512.h"
}  // namespace

void matmul_q8_rows_avx512_vnni(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  q8_rows_avx512<true>(type, a, M, n_begin, n_end);
}

}  // namespace specdec::gguf
#pragma GCC pop_options

#else
namespace specdec::gguf {
void matmul_q8_rows_avx512_vnni(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  matmul_q8_rows_portable(type, a, M, n_begin, n_end);
}
}  // namespace specdec::gguf
#endif
