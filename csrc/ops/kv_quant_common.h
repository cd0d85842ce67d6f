// Shape checks shared by the CPU and CUDA glue of the `kv_quant` family (the hierarchical 4-bit
// KV cache, csrc/kernels/kv_quant/hier4.h). Every message names the tensor and its shape.
#pragma once

#include "ops/aten.h"

#include <cstdint>

namespace specdec::ops {

struct KvShape {
  int64_t B, H, T, D, capacity;  // T: tokens of the block / read-back; capacity: cache tokens
};

inline void check_codes(const at::Tensor& t, const char* name, int64_t B, int64_t H, int64_t D) {
  // upper / lower: (B, H, capacity, D/2) uint8
  TORCH_CHECK(t.scalar_type() == at::kByte && t.dim() == 4 && t.size(0) == B && t.size(1) == H &&
                  t.size(3) == D / 2 && t.is_contiguous(),
              name, " must be a contiguous uint8 [", B, ", ", H, ", capacity, ", D / 2, "] tensor; got ",
              t.scalar_type(), " ", t.sizes());
}

inline void check_params(const at::Tensor& t, const char* name, at::IntArrayRef expected) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.sizes() == expected && t.is_contiguous(), name,
              " must be a contiguous float32 tensor of shape ", expected, "; got ", t.scalar_type(), " ",
              t.sizes());
}

inline void check_activation(const at::Tensor& x, const char* name) {
  // x: (B, H, T, D)
  TORCH_CHECK(x.dim() == 4 && x.is_contiguous() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kHalf ||
                   x.scalar_type() == at::kBFloat16),
              name, " must be a contiguous float32/float16/bfloat16 [B, H, T, D] tensor; got ",
              x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(x.size(3) % 2 == 0, name, " head_dim must be even; got shape ", x.sizes());
}

// Keys grouped along tokens: capacity and T multiples of the group.
inline KvShape check_keys(const at::Tensor& k, const at::Tensor& upper, const at::Tensor& lower,
                          const at::Tensor& scale, const at::Tensor& zero, int64_t G, bool block) {
  const int64_t B = k.size(0), H = k.size(1), T = k.size(2), D = k.size(3);
  TORCH_CHECK(G > 0, "group_size must be positive; got ", G);
  check_codes(upper, "k_upper", B, H, D);
  check_codes(lower, "k_lower", B, H, D);
  TORCH_CHECK(lower.sizes() == upper.sizes(), "k_lower ", lower.sizes(), " must match k_upper ", upper.sizes());
  const int64_t cap = upper.size(2);
  TORCH_CHECK(cap % G == 0, "key capacity (k_upper.size(2) = ", cap, ") must be a multiple of group_size ", G);
  check_params(scale, "k_scale", {B, H, cap / G, D});
  check_params(zero, "k_zero", {B, H, cap / G, D});
  if (block) {
    TORCH_CHECK(T % G == 0 && T <= cap, "k block of shape ", k.sizes(), " must hold a multiple of group_size=",
                G, " tokens, at most the capacity ", cap);
  } else {
    TORCH_CHECK(T <= cap, "out of shape ", k.sizes(), " reads more tokens than the capacity ", cap);
  }
  return {B, H, T, D, cap};
}

// Values grouped along channels: D a multiple of an even group.
inline KvShape check_values(const at::Tensor& v, const at::Tensor& upper, const at::Tensor& lower,
                            const at::Tensor& scale, const at::Tensor& zero, int64_t G, bool block) {
  const int64_t B = v.size(0), H = v.size(1), T = v.size(2), D = v.size(3);
  TORCH_CHECK(G > 0 && G % 2 == 0 && D % G == 0, "value group_size must be even and divide head_dim; got ",
              G, " for shape ", v.sizes());
  check_codes(upper, "v_upper", B, H, D);
  check_codes(lower, "v_lower", B, H, D);
  TORCH_CHECK(lower.sizes() == upper.sizes(), "v_lower ", lower.sizes(), " must match v_upper ", upper.sizes());
  const int64_t cap = upper.size(2);
  check_params(scale, "v_scale", {B, H, cap, D / G});
  check_params(zero, "v_zero", {B, H, cap, D / G});
  TORCH_CHECK(T <= cap, (block ? "v" : "out"), " of shape ", v.sizes(), " exceeds the capacity ", cap);
  return {B, H, T, D, cap};
}

inline void check_start(const at::Tensor& start, int64_t B) {
  // start: (B,) int64, token index where each row's block goes
  TORCH_CHECK(start.scalar_type() == at::kLong && start.dim() == 1 && start.size(0) == B && start.is_contiguous(),
              "start must be a contiguous int64 [", B, "] tensor; got ", start.scalar_type(), " ", start.sizes());
}

}  // namespace specdec::ops
