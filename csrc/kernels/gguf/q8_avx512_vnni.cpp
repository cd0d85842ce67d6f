// The AVX-512 + VNNI tier of the Q8-activation GGUF matmul: q8_avx512.cpp's kernel with the sums of
// 4 adjacent u8 x s8 products (Q6_K, Q8_0, Q5_0) in one vpdpbusd instead of vpmaddubsw +
// vpmaddwd. The integers, hence the bits, are those of the other tiers (q8_vec_avx512.h).
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
  // Q8_0 stays on V256: 512-bit vpsignb does not exist, and its three-op stand-in made Q8_0
  // slower than the AVX2 tier (bench/bench_gguf_compute.py: 12.1-12.7 against 11.1 ns per 256
  // weights at one row).
  if (type == 8) {
    q8_rows<V256, 8>(type, a, M, n_begin, n_end);
    return;
  }
  const int64_t pairs_end = n_begin + (n_end - n_begin) / 2 * 2;
  q8_rows<V512Q8<true>, 8>(type, a, M, n_begin, pairs_end);
  if (pairs_end < n_end) q8_rows<V256, 8>(type, a, M, pairs_end, n_end);
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
