// The AVX2 tier of the Q8-activation GGUF matmul (q8_body.h over V256), compiled for AVX2 through
// a target pragma (a default build targets baseline x86-64; q8_cpu.cpp picks the tier at run time).
#include "kernels/gguf/q8_tiers.h"

#if defined(__x86_64__)
#include <cstdint>
#include <cstring>

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

// Up to 8 rows of x per tile: one accumulator per row; the 8 decoded weight vectors of an octet
// and its scale vectors live in L1 (spilled) beside them.
void matmul_q8_rows_avx2(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
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
