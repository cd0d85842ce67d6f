// The AVX2 + FMA tier of the GGUF matmul (matmul_body.h over V256), compiled for AVX2 through a
// target pragma (a default build targets baseline x86-64; gguf_cpu.cpp picks the tier at run time).
#include "kernels/gguf/matmul_tiers.h"

#if defined(__x86_64__)
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/common/dtype.h"
#include "kernels/gguf/blocks.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#include <immintrin.h>

namespace specdec::gguf {
namespace {
#include "kernels/gguf/matmul_body.h"
#include "kernels/gguf/vec_avx2.h"
}  // namespace

// Up to 4 rows of x per tile: Q4_K keeps A, B, P, Q per row, 16 ymm at 4 rows before the decoded
// vectors, so GCC spills some P / Q to L1 there (not tuned yet: M = 16 costs ~8x M = 1 today).
void matmul_rows_avx2(int32_t type, const MatmulArgs& a, int64_t M, int64_t n_begin, int64_t n_end) {
  gguf_rows<V256, 4>(type, a, M, n_begin, n_end);
}

}  // namespace specdec::gguf
#pragma GCC pop_options

#else
namespace specdec::gguf {
void matmul_rows_avx2(int32_t type, const MatmulArgs& a, int64_t M, int64_t n_begin, int64_t n_end) {
  matmul_rows_portable(type, a, M, n_begin, n_end);
}
}  // namespace specdec::gguf
#endif
