// The Q8K matmul (q8k.h): the activation quantiser, the portable tier (written straight from the
// float order: the reference the VNNI tier is tested against bit for bit) and the run-time choice.
// Compiled for baseline x86-64: the fused steps are std::fma, nothing else fuses.
#include "kernels/gguf/q8k.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/cpu_isa.h"
#include "kernels/gguf/blocks.h"
#include "kernels/gguf/panels.h"
#include "kernels/gguf/q8_round.h"
#include "kernels/gguf/q8k_decode.h"

namespace specdec::gguf {

// The VNNI tier (q8k_avx512_vnni.cpp).
void matmul_q8k_rows_avx512_vnni(int32_t type, const uint8_t* xk, int64_t M, int64_t K, const uint8_t* weight,
                                 float* y, int64_t ldy, int64_t n_begin, int64_t n_end);

namespace {

const bool kVnni = cpu_avx512_bw_vl_dq_fma_enabled() && cpu_avx512_vnni_enabled();

void portable_rows(int32_t type, const uint8_t* xk, int64_t M, int64_t K, const uint8_t* weight, float* y,
                   int64_t ldy, int64_t n_begin, int64_t n_end) {
  const int64_t T = K / kQK_K, rb = K / kQK_K * block_bytes(type), xb = q8k_row_bytes(K);
  const int subs = q8k_sub_blocks(type), len = 256 / subs;
  const bool q4 = file_type(type) == 12;
  std::vector<Q8kSuperblock> row(static_cast<size_t>(T));  // row n's super-blocks, decoded once for all of x
  for (int64_t n = n_begin; n < n_end; ++n) {
    for (int64_t t = 0; t < T; ++t) q8k_decode(type, weight + n * rb, t, row[t]);
    for (int64_t m = 0; m < M; ++m) {
      const int8_t* q = reinterpret_cast<const int8_t*>(xk + m * xb);
      const float* dx = reinterpret_cast<const float*>(xk + m * xb + K);
      const int16_t* s = reinterpret_cast<const int16_t*>(xk + m * xb + K + 4 * T);
      float A = 0.0f;
      for (int64_t t = 0; t < T; ++t) {
        const Q8kSuperblock& sb = row[t];
        int32_t S = 0, P = 0;
        for (int j = 0; j < subs; ++j) {
          int32_t dot = 0;
          for (int k = 0; k < len; ++k) dot += static_cast<int32_t>(sb.w[len * j + k]) * q[256 * t + len * j + k];
          S += sb.sc[j] * dot;
        }
        for (int h = 0; h < 16; ++h) P += sb.pc[h] * s[16 * t + h];
        const float dd = sb.d * dx[t];
        if (q4) {
          const float dm = sb.dmin * dx[t];
          A = std::fma(static_cast<float>(S), dd, A);
          A = std::fma(-static_cast<float>(P), dm, A);
        } else {
          A = std::fma(static_cast<float>(S - 32 * P), dd, A);
        }
      }
      y[m * ldy + n] = A;
    }
  }
}

}  // namespace

bool q8k_supported(int32_t type) { return file_type(type) == 12 || file_type(type) == 14; }

int64_t q8k_row_bytes(int64_t K) { return (K + 4 * (K / kQK_K) + 2 * (K / 16) + 63) / 64 * 64; }

void quantize_rows_q8k(const float* x, int64_t M, int64_t K, uint8_t* xk) {
  const int64_t T = K / kQK_K, rb = q8k_row_bytes(K);
  for (int64_t m = 0; m < M; ++m) {
    uint8_t* out = xk + m * rb;
    std::memset(out, 0, rb);
    quantize_row_int8(x + m * K, K, kQK_K, reinterpret_cast<int8_t*>(out), reinterpret_cast<float*>(out + K),
                      reinterpret_cast<int16_t*>(out + K + 4 * T));
  }
}

void matmul_q8k_rows(int32_t type, const uint8_t* xk, int64_t M, int64_t K, const uint8_t* weight, float* y,
                     int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (M <= 0 || n_end <= n_begin) return;
  if (kVnni) {
    matmul_q8k_rows_avx512_vnni(type, xk, M, K, weight, y, ldy, n_begin, n_end);
  } else if (is_panels(type)) {
    panel_groups_in_file_order(type, weight, K / kQK_K * block_bytes(type), n_begin, n_end,
                               [&](int32_t file, const uint8_t* rows, int64_t g0, int64_t lo, int64_t hi) {
                                 portable_rows(file, xk, M, K, rows, y + g0, ldy, lo, hi);
                               });
  } else {
    portable_rows(type, xk, M, K, weight, y, ldy, n_begin, n_end);
  }
}

}  // namespace specdec::gguf
