// The AVX-512 tier of the Q8-activation GGUF matmul. For now it is q8_body.h over the AVX2
// primitives (V256) compiled with AVX-512 F / BW / VL / DQ enabled: the compiler may use the 32
// vector registers and EVEX encodings (fewer spills of the 8 decoded weight vectors of an octet at
// large tiles), and the intrinsics' semantics are those of the AVX2 tier, so the bits are the same
// by construction. A kernel with 512-bit vectors (two rows of W per zmm, as gguf_avx512.cpp) and
// VNNI (vpdpbusd) is the next step; this machine's tests cannot run it.
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
}  // namespace

void matmul_q8_rows_avx512(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  q8_rows<V256, 8>(type, a, M, n_begin, n_end);
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
