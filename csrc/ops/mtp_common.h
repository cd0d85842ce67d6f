// Shape rules shared by the CPU and CUDA glue of the `mtp` family (fused MTP-head ops).
#pragma once

#include "ops/aten.h"

namespace specdec::ops {

// The accumulation / output dtype of the fused ops: float64 for float64 inputs, else float32.
inline at::ScalarType mtp_acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

inline void check_mtp_float(const at::Tensor& t, const char* name, at::ScalarType dtype) {
  TORCH_CHECK(t.scalar_type() == dtype, name, " must have x's dtype ", dtype, "; got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

// x: (M, H); norm_weight: (H,); lm_head: (V, H); values / indices: (M, k); logits: (M, V) or
// undefined; status: (M,) int32. Returns k.
// The outputs of the head top-k ops: values [M, k] of `acc` (1 <= k <= min(64, V)), indices
// [M, k] int64, logits [M, V] of `acc` or none, status [M] int32. Returns k.
inline int64_t check_topk_outputs(int64_t M, int64_t V, at::ScalarType acc, const at::Tensor& values,
                                  const at::Tensor& indices, const std::optional<at::Tensor>& logits,
                                  const at::Tensor& status) {
  TORCH_CHECK(values.dim() == 2 && values.size(0) == M && values.scalar_type() == acc && values.is_contiguous(),
              "values must be a contiguous [", M, ", k] ", acc, " tensor; got ", values.scalar_type(), " ",
              values.sizes());
  const int64_t k = values.size(1);
  TORCH_CHECK(k >= 1 && k <= 64 && k <= V, "k must lie in [1, min(64, V=", V, ")]; got ", k);
  TORCH_CHECK(indices.sizes() == values.sizes() && indices.scalar_type() == at::kLong && indices.is_contiguous(),
              "indices must be a contiguous int64 tensor of values' shape [", M, ", ", k, "]; got ",
              indices.scalar_type(), " ", indices.sizes());
  if (logits.has_value()) {
    TORCH_CHECK(logits->dim() == 2 && logits->size(0) == M && logits->size(1) == V &&
                    logits->scalar_type() == acc && logits->is_contiguous(),
                "logits must be a contiguous [", M, ", ", V, "] ", acc, " tensor; got ", logits->scalar_type(), " ",
                logits->sizes());
  }
  TORCH_CHECK(status.dim() == 1 && status.size(0) == M && status.scalar_type() == at::kInt,
              "status must be [", M, "] int32; got ", status.scalar_type(), " ", status.sizes());
  return k;
}

inline int64_t check_head_topk(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& lm_head,
                               const at::Tensor& values, const at::Tensor& indices,
                               const std::optional<at::Tensor>& logits, const at::Tensor& status) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
              "x must be float32, float64, float16 or bfloat16; got ", dtype);
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [M, H] tensor; got ", x.sizes());
  const int64_t M = x.size(0), H = x.size(1);
  check_mtp_float(norm_weight, "norm_weight", dtype);
  check_mtp_float(lm_head, "lm_head", dtype);
  TORCH_CHECK(norm_weight.dim() == 1 && norm_weight.size(0) == H, "norm_weight must be [", H, "]; got ",
              norm_weight.sizes());
  TORCH_CHECK(lm_head.dim() == 2 && lm_head.size(1) == H, "lm_head must be [V, ", H, "]; got ", lm_head.sizes());
  const int64_t V = lm_head.size(0);
  const int64_t k = check_topk_outputs(M, V, mtp_acc_type(dtype), values, indices, logits, status);
  for (const at::Tensor* t : {&norm_weight, &lm_head, &values, &indices, &status})
    TORCH_CHECK(t->device() == x.device(), "every tensor must be on x's device ", x.device());
  if (logits.has_value()) TORCH_CHECK(logits->device() == x.device(), "logits must be on x's device");
  return k;
}

// h: (M, H); tokens: (M,) int64; embed: (V, H); enorm / hnorm: (H,); eh_proj: (H, 2H);
// out: (M, H) of the accumulation dtype; status: (M,) int32.
inline void check_mtp_input(const at::Tensor& h, const at::Tensor& tokens, const at::Tensor& embed,
                            const at::Tensor& enorm_weight, const at::Tensor& hnorm_weight,
                            const at::Tensor& eh_proj, const at::Tensor& out, const at::Tensor& status) {
  const auto dtype = h.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf || dtype == at::kBFloat16,
              "h must be float32, float64, float16 or bfloat16; got ", dtype);
  TORCH_CHECK(h.dim() == 2 && h.is_contiguous(), "h must be a contiguous [M, H] tensor; got ", h.sizes());
  const int64_t M = h.size(0), H = h.size(1);
  TORCH_CHECK(tokens.dim() == 1 && tokens.size(0) == M && tokens.scalar_type() == at::kLong && tokens.is_contiguous(),
              "tokens must be a contiguous [", M, "] int64 tensor; got ", tokens.scalar_type(), " ", tokens.sizes());
  check_mtp_float(embed, "embed", dtype);
  check_mtp_float(enorm_weight, "enorm_weight", dtype);
  check_mtp_float(hnorm_weight, "hnorm_weight", dtype);
  check_mtp_float(eh_proj, "eh_proj", dtype);
  TORCH_CHECK(embed.dim() == 2 && embed.size(1) == H, "embed must be [V, ", H, "]; got ", embed.sizes());
  TORCH_CHECK(enorm_weight.dim() == 1 && enorm_weight.size(0) == H && hnorm_weight.dim() == 1 &&
                  hnorm_weight.size(0) == H,
              "enorm_weight and hnorm_weight must be [", H, "]; got ", enorm_weight.sizes(), " and ",
              hnorm_weight.sizes());
  TORCH_CHECK(eh_proj.dim() == 2 && eh_proj.size(0) == H && eh_proj.size(1) == 2 * H, "eh_proj must be [", H,
              ", ", 2 * H, "]; got ", eh_proj.sizes());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == M && out.size(1) == H && out.is_contiguous() &&
                  out.scalar_type() == mtp_acc_type(dtype),
              "out must be a contiguous [", M, ", ", H, "] ", mtp_acc_type(dtype), " tensor; got ",
              out.scalar_type(), " ", out.sizes());
  TORCH_CHECK(status.dim() == 1 && status.size(0) == M && status.scalar_type() == at::kInt,
              "status must be [", M, "] int32; got ", status.scalar_type(), " ", status.sizes());
  for (const at::Tensor* t : {&tokens, &embed, &enorm_weight, &hnorm_weight, &eh_proj, &out, &status})
    TORCH_CHECK(t->device() == h.device(), "every tensor must be on h's device ", h.device());
}

}  // namespace specdec::ops
