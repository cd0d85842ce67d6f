// Shape checks shared by the CPU and CUDA glue of the `quant_attention` family (attention over the
// hierarchical 4-bit KV cache, csrc/kernels/quant_attention). Every message names the tensor.
#pragma once

#include "ops/aten.h"

#include <optional>

#include "kernels/quant_attention/quant_attention.h"

namespace specdec::ops {

inline void qattn_check(const at::Tensor& t, const char* name, at::ScalarType dtype, at::IntArrayRef shape) {
  TORCH_CHECK(t.scalar_type() == dtype && t.sizes() == shape && t.is_contiguous(), "quant_kv_attention: ", name,
              " must be a contiguous ", dtype, " tensor of shape ", shape, "; got ", t.scalar_type(), " ",
              t.sizes(), t.is_contiguous() ? "" : " (not contiguous)");
}

// Checks every shape and fills the kernel's arguments (pointers of the tensors as given).
inline qattn::Args quant_attention_args(const at::Tensor& q, const at::Tensor& k_upper, const at::Tensor& k_lower,
                                        const at::Tensor& k_scale, const at::Tensor& k_zero,
                                        const at::Tensor& v_upper, const at::Tensor& v_lower,
                                        const at::Tensor& v_scale, const at::Tensor& v_zero,
                                        const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                                        const at::Tensor& quant_len, const at::Tensor& buffer_start,
                                        const at::Tensor& lengths, const std::optional<at::Tensor>& tree_mask,
                                        int64_t key_group, int64_t value_group, bool use_lower, double sm_scale,
                                        at::Tensor& out) {
  // q: (B, Hq, n, D) float32
  TORCH_CHECK(q.dim() == 4 && q.scalar_type() == at::kFloat && q.is_contiguous(),
              "quant_kv_attention: q must be a contiguous float32 [B, Hq, n, D] tensor; got ", q.scalar_type(), " ",
              q.sizes());
  const int64_t B = q.size(0), Hq = q.size(1), n = q.size(2), D = q.size(3);
  TORCH_CHECK(D % 2 == 0 && D > 0, "quant_kv_attention: head_dim must be even; q has shape ", q.sizes());
  // k_upper: (B, Hkv, capacity, D/2) uint8
  TORCH_CHECK(k_upper.dim() == 4, "quant_kv_attention: k_upper must be [B, Hkv, capacity, D/2]; got ", k_upper.sizes());
  const int64_t Hkv = k_upper.size(1), cap = k_upper.size(2);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "quant_kv_attention: q's ", Hq, " heads must be a multiple of the cache's ",
              Hkv, " KV heads");
  TORCH_CHECK(key_group > 0 && cap % key_group == 0, "quant_kv_attention: key_group ", key_group,
              " must be positive and divide the capacity ", cap);
  TORCH_CHECK(value_group > 0 && value_group % 2 == 0 && D % value_group == 0, "quant_kv_attention: value_group ",
              value_group, " must be even and divide head_dim ", D);
  for (const auto& [name, t] : {std::pair{"k_upper", &k_upper}, {"k_lower", &k_lower}, {"v_upper", &v_upper},
                                {"v_lower", &v_lower}})
    qattn_check(*t, name, at::kByte, {B, Hkv, cap, D / 2});
  qattn_check(k_scale, "k_scale", at::kFloat, {B, Hkv, cap / key_group, D});   // (B, Hkv, capacity/Gk, D)
  qattn_check(k_zero, "k_zero", at::kFloat, {B, Hkv, cap / key_group, D});
  qattn_check(v_scale, "v_scale", at::kFloat, {B, Hkv, cap, D / value_group});  // (B, Hkv, capacity, D/Gv)
  qattn_check(v_zero, "v_zero", at::kFloat, {B, Hkv, cap, D / value_group});
  // k_buffer / v_buffer: (B, Hkv, F, D) float32
  TORCH_CHECK(k_buffer.dim() == 4, "quant_kv_attention: k_buffer must be [B, Hkv, F, D]; got ", k_buffer.sizes());
  const int64_t F = k_buffer.size(2);
  qattn_check(k_buffer, "k_buffer", at::kFloat, {B, Hkv, F, D});
  qattn_check(v_buffer, "v_buffer", at::kFloat, {B, Hkv, F, D});
  qattn_check(quant_len, "quant_len", at::kLong, {B, n});        // (B, n) per query
  qattn_check(buffer_start, "buffer_start", at::kLong, {B});     // (B,)
  qattn_check(lengths, "lengths", at::kLong, {B});               // (B,)
  if (tree_mask.has_value()) qattn_check(*tree_mask, "tree_mask", at::kBool, {B, n, n});  // (B, n, n)
  qattn_check(out, "out", at::kFloat, {B, Hq, n, D});
  qattn::Args a{};
  a.q = q.data_ptr<float>();
  a.k_upper = k_upper.data_ptr<uint8_t>();
  a.k_lower = k_lower.data_ptr<uint8_t>();
  a.k_scale = k_scale.data_ptr<float>();
  a.k_zero = k_zero.data_ptr<float>();
  a.v_upper = v_upper.data_ptr<uint8_t>();
  a.v_lower = v_lower.data_ptr<uint8_t>();
  a.v_scale = v_scale.data_ptr<float>();
  a.v_zero = v_zero.data_ptr<float>();
  a.k_buffer = k_buffer.data_ptr<float>();
  a.v_buffer = v_buffer.data_ptr<float>();
  a.quant_len = quant_len.data_ptr<int64_t>();
  a.buffer_start = buffer_start.data_ptr<int64_t>();
  a.lengths = lengths.data_ptr<int64_t>();
  a.tree_mask = tree_mask.has_value() ? tree_mask->data_ptr<bool>() : nullptr;
  a.out = out.data_ptr<float>();
  a.B = B, a.Hq = Hq, a.Hkv = Hkv, a.n = n, a.D = D, a.capacity = cap, a.F = F;
  a.key_group = key_group, a.value_group = value_group;
  a.use_lower = use_lower;
  a.sm_scale = static_cast<float>(sm_scale);
  return a;
}

}  // namespace specdec::ops
