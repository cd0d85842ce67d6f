// The AVX-512 tier of the Q8-activation GGUF matmul: q8_body.h over V512Q8 (q8_vec_avx512.h), two
// rows of W per zmm register, each 256-bit half running exactly the AVX2 tier's integer and float
// steps on its row (the same bits); Q8_0 and an odd last row of W run V256 (q8_rows_avx512).
// q8_avx512_vnni.cpp builds the same kernel with VNNI's vpdpbusd for the 4-product dot; this file
// serves AVX-512 CPUs without it.
#include "kernels/gguf/q8_tiers.h"

#if defined(__x86_64__)
#include <cstdint>
#include <cstring>

#include "kernels/common/dtype.h"
#include "kernels/gguf/blocks.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized in _mm512_setzero_ps-style helpers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace specdec::gguf {
namespace {
#include "kernels/gguf/q8_body.h"
#include "kernels/gguf/q8_vec_avx2.h"
#include "kernels/gguf/q8_vec_avx512.h"
}  // namespace

void matmul_q8_rows_avx512(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  q8_rows_avx512<false>(type, a, M, n_begin, n_end);
}

}  // namespace specdec::gguf
#pragma GCC pop_options

#else
namespace specdec::gguf {
void matmul_q8_rows_avx512(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  matmul_q8_rows_portable(type, a, M, n_begin, n_end);
}
}  // namespace specdec::gguf
#endif
