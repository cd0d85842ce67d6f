// GGUF blocks on the CPU (see gguf_cpu.h): the dequantisers, the portable matmul tier and the
// run-time choice among the portable, AVX2 (gguf_avx2.cpp) and AVX-512 (gguf_avx512.cpp) tiers.
// This file is compiled for baseline x86-64: no FMA instruction exists for the compiler to fuse a
// dequantiser's multiply and add into, so they round as blocks.h says.
#include "kernels/gguf/gguf_cpu.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/cpu_isa.h"
#include "kernels/common/dtype.h"
#include "kernels/gguf/blocks.h"
#include "kernels/gguf/matmul_tiers.h"

namespace specdec::gguf {
namespace {

#include "kernels/gguf/matmul_body.h"

// The portable tier: 8 lanes as plain arrays, std::fma for every fused step (one rounding, as the
// vector FMA instructions). Slow (glibc's fma per lane); it exists for CPUs without AVX2 and to
// hold the vector tiers to the same bits in the tests.
struct VPortable {
  static constexpr int kRows = 1;
  struct F {
    float v[8];
  };
  struct I {
    int32_t v[8];
  };

  template <class Op>
  static F map(Op op) {
    F r;
    for (int j = 0; j < 8; ++j) r.v[j] = op(j);
    return r;
  }
  template <class Op>
  static I imap(Op op) {
    I r;
    for (int j = 0; j < 8; ++j) r.v[j] = op(j);
    return r;
  }
  static F zero() { return map([](int) { return 0.0f; }); }
  static F mul(F a, F b) { return map([&](int j) { return a.v[j] * b.v[j]; }); }
  static F fma(F a, F b, F c) { return map([&](int j) { return std::fma(a.v[j], b.v[j], c.v[j]); }); }
  static F fnma(F a, F b, F c) { return map([&](int j) { return std::fma(-a.v[j], b.v[j], c.v[j]); }); }
  static F add(F a, F b) { return map([&](int j) { return a.v[j] + b.v[j]; }); }
  static F x8(const float* p) { return map([&](int j) { return p[j]; }); }
  static I u8x8(const uint8_t* p, int64_t) { return imap([&](int j) { return static_cast<int32_t>(p[j]); }); }
  static I s8x8(const uint8_t* p, int64_t) {
    return imap([&](int j) { return static_cast<int32_t>(static_cast<int8_t>(p[j])); });
  }
  static F rows(const float* v) { return map([&](int) { return v[0]; }); }
  static I rows_i(const int32_t* v) { return imap([&](int) { return v[0]; }); }
  static F lane(F v, int s) { return map([&](int) { return v.v[s]; }); }
  static F cvt(I a) { return map([&](int j) { return static_cast<float>(a.v[j]); }); }
  static I and_(I a, int c) { return imap([&](int j) { return a.v[j] & c; }); }
  static I or_(I a, I b) { return imap([&](int j) { return a.v[j] | b.v[j]; }); }
  static I sub(I a, int c) { return imap([&](int j) { return a.v[j] - c; }); }
  static I srli(I a, int n) { return imap([&](int j) { return static_cast<int32_t>(static_cast<uint32_t>(a.v[j]) >> n); }); }
  static I slli(I a, int n) { return imap([&](int j) { return static_cast<int32_t>(static_cast<uint32_t>(a.v[j]) << n); }); }
  static I srlv_lanes(I a, int base) {
    return imap([&](int j) { return static_cast<int32_t>(static_cast<uint32_t>(a.v[j]) >> (base + j)); });
  }
  static void hsum(F v, float* out) {
    const float* x = v.v;
    out[0] = ((x[0] + x[4]) + (x[2] + x[6])) + ((x[1] + x[5]) + (x[3] + x[7]));
  }
};

// The widest tier SPECDEC_CPU_ISA allows on this CPU (kernels/common/cpu_isa.h).
const bool kAvx512 = cpu_avx512_fma_enabled();
const bool kAvx2 = cpu_avx2_is_widest();

// bfloat16 bits of a float32, rounded to nearest even (NaN -> the canonical quiet NaN, as torch).
uint16_t to_bf16_bits(float f) {
  const uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace

void matmul_rows_portable(int32_t type, const MatmulArgs& a, int64_t M, int64_t n_begin, int64_t n_end) {
  gguf_rows<VPortable, 4>(type, a, M, n_begin, n_end);
}

void matmul_cpu_rows(int32_t type, const float* x, int64_t M, int64_t K, const uint8_t* weight, float* y,
                     int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (M <= 0 || n_end <= n_begin) return;
  if (is_lanes(type)) {
    // Repacked for the Q8 kernel's lane dots (blocks.h): these rows back in the file's order first.
    const int64_t row_bytes = K / kQK_K * block_bytes(type);
    std::vector<uint8_t> rows(static_cast<size_t>((n_end - n_begin) * row_bytes));
    blocks_from_lanes(type, weight + n_begin * row_bytes, (n_end - n_begin) * row_bytes, rows.data());
    matmul_cpu_rows(file_type(type), x, M, K, rows.data(), y + n_begin, ldy, 0, n_end - n_begin);
    return;
  }
  // Q4_K and Q4_1 fold their mins in through the sums of x over 32-weight groups, [M, K / 32],
  // added left to right (a few microseconds per call; each thread computes its own copy).
  std::vector<float> xsum;
  if (type == static_cast<int32_t>(Type::kQ4_K) || type == static_cast<int32_t>(Type::kQ4_1)) {
    xsum.resize(M * (K / 32));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t g = 0; g < K / 32; ++g) {
        float s = 0.0f;
        for (int i = 0; i < 32; ++i) s += x[m * K + 32 * g + i];
        xsum[m * (K / 32) + g] = s;
      }
  }
  const MatmulArgs args{x, xsum.data(), K, weight, K / block_weights(type) * block_bytes(type), y, ldy};
  if (kAvx512) {
    matmul_rows_avx512(type, args, M, n_begin, n_end);
  } else if (kAvx2) {
    matmul_rows_avx2(type, args, M, n_begin, n_end);
  } else {
    matmul_rows_portable(type, args, M, n_begin, n_end);
  }
}

void dequantize_cpu_rows(int32_t type, const uint8_t* weight, int64_t K, float* out, int64_t n_begin, int64_t n_end) {
  for (int64_t n = n_begin; n < n_end; ++n) dequantize_row(type, weight, K, n, out + n * K);
}

void dequantize_cpu_rows_bf16(int32_t type, const uint8_t* weight, int64_t K, uint16_t* out, int64_t n_begin,
                              int64_t n_end) {
  std::vector<float> row(K);
  for (int64_t n = n_begin; n < n_end; ++n) {
    dequantize_row(type, weight, K, n, row.data());
    for (int64_t k = 0; k < K; ++k) out[n * K + k] = to_bf16_bits(row[k]);
  }
}

const char* matmul_cpu_isa() { return kAvx512 ? "avx512" : kAvx2 ? "avx2" : "portable"; }

}  // namespace specdec::gguf
