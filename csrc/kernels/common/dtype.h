// Torch-free 16-bit float decoding shared by CPU and CUDA kernels.
//
// Kernels take logits as raw bit patterns (uint16_t for fp16 / bf16) so the kernel layer needs
// neither torch's c10::Half nor CUDA's __half types; decoding to float is exact.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/hd.h"

namespace specdec {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

struct Half16 {  // IEEE binary16 bits
  uint16_t bits;
};
struct BFloat16 {  // bfloat16 bits (upper half of a float32)
  uint16_t bits;
};

SPECDEC_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
#endif
}

SPECDEC_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
#endif
}

SPECDEC_HD float to_float(float x) { return x; }
SPECDEC_HD float to_float(double x) { return static_cast<float>(x); }
SPECDEC_HD float to_float(BFloat16 x) { return bits_to_float(static_cast<uint32_t>(x.bits) << 16); }

// Exact binary16 -> binary32, branch-light so the CPU loops vectorise.
SPECDEC_HD float to_float(Half16 x) {
  const uint32_t h = x.bits;
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp_mant = h & 0x7fffu;
  // Shift exponent+mantissa into float position and rebias (15 -> 127); then fix the special
  // cases: Inf/NaN (exponent all ones) and subnormals (exponent zero), via a magic multiply.
  uint32_t bits = exp_mant << 13;
  const uint32_t exponent = exp_mant & 0x7c00u;
  if (exponent == 0x7c00u) {
    bits |= 0x7f800000u;  // Inf / NaN keep their payload
  } else if (exponent == 0) {
    // subnormal or zero: value = mantissa * 2^-24
    const float v = static_cast<float>(exp_mant) * 5.9604644775390625e-08f;
    return bits_to_float(sign | float_to_bits(v));
  } else {
    bits += (127u - 15u) << 23;
  }
  return bits_to_float(sign | bits);
}

// Order-preserving map from float to uint32 (larger float -> larger key); used by radix selects.
// NaNs must be rejected before calling.
SPECDEC_HD uint32_t float_order_key(float f) {
  const uint32_t u = float_to_bits(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

SPECDEC_HD float float_from_order_key(uint32_t key) {
  const uint32_t u = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  return bits_to_float(u);
}

}  // namespace specdec
