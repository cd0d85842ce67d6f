// Shape / dtype checks and argument packing shared by diffusion_cpu.cpp and diffusion_cuda.cpp.
#pragma once

#include "ops/aten.h"
#include <torch/library.h>

#include "kernels/diffusion/unmask.h"
#include "ops/sampling_common.h"

namespace specdec {
namespace diffusion_glue {

// `position_status` is the [batch, width] int32 workspace of step 1, allocated by the caller.
inline diffusion::UnmaskArgs unmask_args(
    const at::Tensor& logits, const at::Tensor& tokens, int64_t mask_id,
    const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
    const at::Tensor& seed, const at::Tensor& position, const at::Tensor& step,
    const at::Tensor& num_transfer, const at::Tensor& threshold, const at::Tensor& sampled,
    const at::Tensor& confidence, const at::Tensor& keep, const at::Tensor& status,
    const at::Tensor& position_status) {
  using sampling_glue::check_vector;
  // logits: (batch, width, vocab), vocab contiguous; the batch and width strides are free so a
  // block's slice of a longer sequence's logits needs no copy
  TORCH_CHECK(logits.dim() == 3, "logits must have shape [batch, width, vocab], got ",
              logits.sizes());
  TORCH_CHECK(logits.size(2) > 0, "logits must have a non-empty vocab dimension");
  TORCH_CHECK(logits.stride(2) == 1 || logits.size(2) == 1,
              "logits must be contiguous along the vocab dimension, got strides ", logits.strides());
  const int64_t batch = logits.size(0), width = logits.size(1);
  const auto device = logits.device();
  // tokens: (batch, width) int64
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == batch && tokens.size(1) == width,
              "tokens must have shape [", batch, ", ", width, "] like logits' first two "
              "dimensions, got ", tokens.sizes());
  TORCH_CHECK(tokens.scalar_type() == at::kLong && tokens.is_contiguous() && tokens.device() == device,
              "tokens must be a contiguous int64 tensor on ", device);
  diffusion::UnmaskArgs a;
  a.logits = logits.data_ptr();
  a.dtype = sampling_glue::logits_dtype(logits, "logits");
  a.batch = batch;
  a.width = width;
  a.vocab = logits.size(2);
  a.stride_b = logits.stride(0);
  a.stride_w = logits.stride(1);
  a.tokens = tokens.data_ptr<int64_t>();
  a.mask_id = mask_id;
  // per-row parameters: (batch,)
  check_vector(temperature, "temperature", at::kFloat, batch, device);
  check_vector(top_k, "top_k", at::kInt, batch, device);
  check_vector(top_p, "top_p", at::kFloat, batch, device);
  check_vector(seed, "seed", at::kLong, batch, device);
  check_vector(position, "position", at::kLong, batch, device);
  check_vector(step, "step", at::kLong, batch, device);
  check_vector(num_transfer, "num_transfer", at::kLong, batch, device);
  check_vector(threshold, "threshold", at::kFloat, batch, device);
  a.temperature = temperature.data_ptr<float>();
  a.top_k = top_k.data_ptr<int32_t>();
  a.top_p = top_p.data_ptr<float>();
  a.seed = seed.data_ptr<int64_t>();
  a.position = position.data_ptr<int64_t>();
  a.step = step.data_ptr<int64_t>();
  a.num_transfer = num_transfer.data_ptr<int64_t>();
  a.threshold = threshold.data_ptr<float>();
  // sampled: (batch, width) int64; confidence: (batch, width) float32; keep: (batch, width) bool
  auto check_out = [&](const at::Tensor& t, const char* name, at::ScalarType dtype) {
    TORCH_CHECK(t.dim() == 2 && t.size(0) == batch && t.size(1) == width, name,
                " must have shape [", batch, ", ", width, "], got ", t.sizes());
    TORCH_CHECK(t.scalar_type() == dtype && t.is_contiguous() && t.device() == device, name,
                " must be a contiguous ", dtype, " tensor on ", device);
  };
  check_out(sampled, "sampled", at::kLong);
  check_out(confidence, "confidence", at::kFloat);
  check_out(keep, "keep", at::kBool);
  check_out(position_status, "position_status", at::kInt);
  check_vector(status, "status", at::kInt, batch, device);
  a.sampled = sampled.data_ptr<int64_t>();
  a.confidence = confidence.data_ptr<float>();
  a.keep = reinterpret_cast<uint8_t*>(keep.data_ptr<bool>());
  a.status = status.data_ptr<int32_t>();
  a.position_status = position_status.data_ptr<int32_t>();
  return a;
}

}  // namespace diffusion_glue
}  // namespace specdec
