// Hierarchical 4-bit quantisation of KV-cache groups, shared by the CPU and CUDA kernels.
//
// Per group (keys: G tokens of one channel; values: G channels of one token), in float32 with
// every operation rounded separately (no fused multiply-add, so CPU, CUDA and the PyTorch
// reference python/specdec_cuda/reference/kv_quant.py produce the same codes bit for bit):
//   zero = min, scale = (max - zero) / 15
//   upper = clamp(rint((x - zero) / scale), 0, 15)            asymmetric
//   lower = clamp(rint((x - (upper * scale + zero)) / (scale / 16)), -8, 7) + 8
//   (0 and 8 for a constant group, scale == 0)
//   a group holding NaN or +-inf (or whose max - min overflows): scale = zero = NaN and codes 0 / 8, so every value of the group
//   reads back as NaN (a diverging model stays visible to the sampler's non-finite check)
// Storage: upper / lower nibbles packed two channels per byte, even channel in the low nibble.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/hd.h"
#include "kernels/common/rounding.h"

#if !defined(__CUDA_ARCH__)
#include <cmath>
#endif

namespace specdec::kv {

SPECDEC_HD float round_even(float x) {  // same as torch.round: halves to even
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return std::nearbyint(x);
#endif
}
SPECDEC_HD float clampf(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }

struct Codes {
  uint8_t upper;  // 0..15
  uint8_t lower;  // 0..15, residual code + 8
};

SPECDEC_HD Codes quantize_one(float x, float scale, float zero) {
  if (!(scale > 0.f)) return {0, 8};
  const float upper = clampf(round_even(div_rn(sub_rn(x, zero), scale)), 0.f, 15.f);
  const float residual = sub_rn(x, add_rn(mul_rn(upper, scale), zero));
  float lower = clampf(round_even(div_rn(residual, div_rn(scale, 16.f))), -8.f, 7.f);
  // A subnormal scale can make scale / 16 underflow to 0 and 0 / 0 NaN: residual code 0, never a
  // NaN cast to an integer (undefined behaviour).
  if (!(lower == lower)) lower = 0.f;
  return {static_cast<uint8_t>(upper), static_cast<uint8_t>(static_cast<int>(lower) + 8)};
}

SPECDEC_HD float dequantize_one(uint32_t upper, uint32_t lower, float scale, float zero, bool use_lower) {
  float x = add_rn(mul_rn(static_cast<float>(upper), scale), zero);
  if (use_lower) x = add_rn(x, mul_rn(static_cast<float>(static_cast<int>(lower) - 8), div_rn(scale, 16.f)));
  return x;
}

template <typename T>
SPECDEC_HD float load_float(const T* p, int64_t i) {
  return to_float(p[i]);
}

SPECDEC_HD float quiet_nan() {
#if defined(__CUDA_ARCH__)
  return __int_as_float(0x7fffffff);
#else
  return std::nanf("");
#endif
}

// x - x is 0 for every finite x and NaN for NaN and +-inf (no <cmath> needed on the device).
SPECDEC_HD bool is_finite(float x) { return sub_rn(x, x) == 0.f; }

// Keys: channels d and d+1 of G consecutive tokens.
//   k:      element (token 0, channel d) of a [tokens, D] slab (token stride D)
//   upper / lower: byte (token 0, d/2) of [tokens, D/2] slabs
//   scale / zero:  entries (group, d) and (group, d+1)
template <typename T>
SPECDEC_HD void quantize_key_pair(const T* k, int64_t D, int64_t G, uint8_t* upper, uint8_t* lower,
                                  float* scale, float* zero) {
  float lo[2], hi[2];
  bool finite[2];
  for (int c = 0; c < 2; ++c) {
    lo[c] = hi[c] = load_float(k, c);
    finite[c] = is_finite(lo[c]);
  }
  for (int64_t t = 1; t < G; ++t)
    for (int c = 0; c < 2; ++c) {
      const float x = load_float(k, t * D + c);
      lo[c] = x < lo[c] ? x : lo[c];
      hi[c] = x > hi[c] ? x : hi[c];
      finite[c] = finite[c] && is_finite(x);
    }
  float s[2];
  for (int c = 0; c < 2; ++c) {
    s[c] = div_rn(sub_rn(hi[c], lo[c]), 15.f);
    // A non-finite value, or a range beyond float (max - min = inf): NaN scale, codes 0 / 8.
    if (!finite[c] || !is_finite(s[c])) s[c] = lo[c] = quiet_nan();
    scale[c] = s[c];
    zero[c] = lo[c];
  }
  for (int64_t t = 0; t < G; ++t) {
    const Codes c0 = quantize_one(load_float(k, t * D), s[0], lo[0]);
    const Codes c1 = quantize_one(load_float(k, t * D + 1), s[1], lo[1]);
    upper[t * (D / 2)] = static_cast<uint8_t>(c0.upper | (c1.upper << 4));
    lower[t * (D / 2)] = static_cast<uint8_t>(c0.lower | (c1.lower << 4));
  }
}

// Values: G consecutive channels of one token (G even). upper / lower: G/2 bytes.
template <typename T>
SPECDEC_HD void quantize_value_group(const T* v, int64_t G, uint8_t* upper, uint8_t* lower,
                                     float* scale, float* zero) {
  float lo = load_float(v, 0), hi = lo;
  bool finite = is_finite(lo);
  for (int64_t i = 1; i < G; ++i) {
    const float x = load_float(v, i);
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
    finite = finite && is_finite(x);
  }
  float s = div_rn(sub_rn(hi, lo), 15.f);
  // A non-finite value, or a range beyond float (max - min = inf): NaN scale, codes 0 / 8.
  if (!finite || !is_finite(s)) s = lo = quiet_nan();
  *scale = s;
  *zero = lo;
  for (int64_t i = 0; i < G; i += 2) {
    const Codes c0 = quantize_one(load_float(v, i), s, lo);
    const Codes c1 = quantize_one(load_float(v, i + 1), s, lo);
    upper[i / 2] = static_cast<uint8_t>(c0.upper | (c1.upper << 4));
    lower[i / 2] = static_cast<uint8_t>(c0.lower | (c1.lower << 4));
  }
}

// Both channels (2i, 2i+1) of one packed byte of one token; s0/z0 and s1/z1 their groups' scale
// and zero. out2: 2 floats.
SPECDEC_HD void dequantize_byte(uint8_t upper, uint8_t lower, float s0, float z0, float s1, float z1,
                                bool use_lower, float* out2) {
  out2[0] = dequantize_one(upper & 15u, lower & 15u, s0, z0, use_lower);
  out2[1] = dequantize_one(upper >> 4, lower >> 4, s1, z1, use_lower);
}

}  // namespace specdec::kv
