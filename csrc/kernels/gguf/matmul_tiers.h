// Internal to the CPU GGUF matmul: what the dispatcher (gguf_cpu.cpp) hands each ISA tier
// (the portable loop there, gguf_avx2.cpp, gguf_avx512.cpp). All tiers run matmul_body.h.
#pragma once

#include <cstdint>

namespace specdec::gguf {

struct MatmulArgs {
  const float* x;          // [M, K] row-major
  const float* xsum;       // [M, K / 32]: sum of x over each 32 consecutive k, added left to right
  int64_t K;
  const uint8_t* weight;   // N rows of row_bytes = K / QK * block bytes
  int64_t row_bytes;
  float* y;                // y[m * ldy + n]
  int64_t ldy;
};

// Rows [n_begin, n_end) of y for all M rows of x.
void matmul_rows_portable(int32_t type, const MatmulArgs& a, int64_t M, int64_t n_begin, int64_t n_end);
void matmul_rows_avx2(int32_t type, const MatmulArgs& a, int64_t M, int64_t n_begin, int64_t n_end);
void matmul_rows_avx512(int32_t type, const MatmulArgs& a, int64_t M, int64_t n_begin, int64_t n_end);

}  // namespace specdec::gguf
