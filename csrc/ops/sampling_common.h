// Shape / dtype checks and argument packing shared by sampling_cpu.cpp and sampling_cuda.cpp.
#pragma once

#include <torch/library.h>
#include "ops/aten.h"

#include "kernels/sampling/chain.h"

namespace specdec {
namespace sampling_glue {

inline DType logits_dtype(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kDouble: return DType::kFloat64;
    default:
      TORCH_CHECK(false, name, " must be float32, float16, bfloat16 or float64, got ",
                  t.scalar_type());
  }
}

inline void check_vector(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t n,
                         const at::Device& device) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n, name, " must have shape [", n, "], got ",
              t.sizes());
  TORCH_CHECK(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.device() == device, name, " must be on ", device, ", got ", t.device());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

inline void check_logits(const at::Tensor& t, const char* name, int64_t rows) {
  TORCH_CHECK(t.dim() == 2 && t.size(0) == rows, name, " must have shape [", rows,
              ", vocab], got ", t.sizes());
  TORCH_CHECK(t.size(1) > 0, name, " must have a non-empty vocab dimension");
  TORCH_CHECK(t.stride(1) == 1, name, " must be contiguous along the vocab dimension");
}

inline sampling::RowParams row_params(const at::Tensor& temperature, const at::Tensor& top_k,
                                      const at::Tensor& top_p, const at::Tensor& seed,
                                      const at::Tensor& position, int64_t rows,
                                      const at::Device& device) {
  // temperature, top_k, top_p, seed, position: (rows,)
  check_vector(temperature, "temperature", at::kFloat, rows, device);
  check_vector(top_k, "top_k", at::kInt, rows, device);
  check_vector(top_p, "top_p", at::kFloat, rows, device);
  check_vector(seed, "seed", at::kLong, rows, device);
  check_vector(position, "position", at::kLong, rows, device);
  return {temperature.data_ptr<float>(), top_k.data_ptr<int32_t>(), top_p.data_ptr<float>(),
          seed.data_ptr<int64_t>(), position.data_ptr<int64_t>()};
}

inline sampling::SampleArgs sample_args(const at::Tensor& logits, const at::Tensor& temperature,
                                        const at::Tensor& top_k, const at::Tensor& top_p,
                                        const at::Tensor& seed, const at::Tensor& position,
                                        int64_t purpose, int64_t substream,
                                        const at::Tensor& tokens, const at::Tensor& status) {
  // logits: (rows, vocab)
  TORCH_CHECK(logits.dim() == 2, "logits must have shape [rows, vocab], got ", logits.sizes());
  const int64_t rows = logits.size(0);
  check_logits(logits, "logits", rows);
  const auto device = logits.device();
  TORCH_CHECK(purpose >= 0 && purpose < 256, "purpose must be in [0, 256), got ", purpose);
  TORCH_CHECK(substream >= 0 && substream < (int64_t{1} << 24),
              "substream must be in [0, 2^24), got ", substream);
  sampling::SampleArgs a;
  a.logits = logits.data_ptr();
  a.dtype = logits_dtype(logits, "logits");
  a.rows = rows;
  a.vocab = logits.size(1);
  a.logits_stride = logits.stride(0);
  a.params = row_params(temperature, top_k, top_p, seed, position, rows, device);
  a.purpose = static_cast<uint32_t>(purpose);
  a.substream = static_cast<uint32_t>(substream);
  // tokens: (rows,) int64; status: (rows,) int32
  check_vector(tokens, "tokens", at::kLong, rows, device);
  check_vector(status, "status", at::kInt, rows, device);
  a.tokens = tokens.data_ptr<int64_t>();
  a.status = status.data_ptr<int32_t>();
  return a;
}

inline sampling::VerifyArgs verify_args(
    const at::Tensor& draft_tokens, const at::Tensor& cu_num_draft, const at::Tensor& target_logits,
    const std::optional<at::Tensor>& draft_logits, const at::Tensor& temperature,
    const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& seed,
    const at::Tensor& position, bool typical, double typical_epsilon, double typical_alpha,
    const at::Tensor& tokens, const at::Tensor& num_accepted, const at::Tensor& accepted,
    const at::Tensor& status) {
  const auto device = target_logits.device();
  // cu_num_draft: (batch + 1,) int64
  TORCH_CHECK(cu_num_draft.dim() == 1 && cu_num_draft.size(0) >= 1,
              "cu_num_draft must have shape [batch + 1], got ", cu_num_draft.sizes());
  const int64_t batch = cu_num_draft.size(0) - 1;
  check_vector(cu_num_draft, "cu_num_draft", at::kLong, batch + 1, device);
  // draft_tokens: (num_drafts,) int64
  TORCH_CHECK(draft_tokens.dim() == 1, "draft_tokens must have shape [num_drafts], got ",
              draft_tokens.sizes());
  const int64_t num_drafts = draft_tokens.size(0);
  check_vector(draft_tokens, "draft_tokens", at::kLong, num_drafts, device);
  // target_logits: (num_drafts + batch, vocab)
  check_logits(target_logits, "target_logits", num_drafts + batch);
  sampling::VerifyArgs a;
  a.draft_tokens = draft_tokens.data_ptr<int64_t>();
  a.cu_num_draft = cu_num_draft.data_ptr<int64_t>();
  a.target_logits = target_logits.data_ptr();
  a.dtype = logits_dtype(target_logits, "target_logits");
  a.batch = batch;
  a.num_drafts = num_drafts;
  a.vocab = target_logits.size(1);
  a.target_stride = target_logits.stride(0);
  a.draft_logits = nullptr;
  a.draft_stride = 0;
  if (draft_logits.has_value()) {
    // draft_logits: (num_drafts, vocab), same dtype as target_logits
    const at::Tensor& d = *draft_logits;
    check_logits(d, "draft_logits", num_drafts);
    TORCH_CHECK(d.size(1) == a.vocab, "draft_logits must have vocab ", a.vocab, " like ",
                "target_logits, got ", d.sizes());
    TORCH_CHECK(d.scalar_type() == target_logits.scalar_type(), "draft_logits must have dtype ",
                target_logits.scalar_type(), " like target_logits, got ", d.scalar_type());
    TORCH_CHECK(d.device() == device, "draft_logits must be on ", device, ", got ", d.device());
    a.draft_logits = d.data_ptr();
    a.draft_stride = d.stride(0);
  }
  a.params = row_params(temperature, top_k, top_p, seed, position, batch, device);
  a.typical = typical;
  a.typical_epsilon = typical_epsilon;
  a.typical_alpha = typical_alpha;
  // tokens: (batch, max_draft + 1) int64; accepted: (batch, max_draft) int8
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == batch && tokens.size(1) >= 1,
              "tokens must have shape [batch, max_draft + 1], got ", tokens.sizes());
  a.max_draft = tokens.size(1) - 1;
  TORCH_CHECK(tokens.scalar_type() == at::kLong && tokens.is_contiguous() &&
                  tokens.device() == device,
              "tokens must be a contiguous int64 tensor on ", device);
  TORCH_CHECK(accepted.dim() == 2 && accepted.size(0) == batch &&
                  accepted.size(1) == a.max_draft,
              "accepted must have shape [", batch, ", ", a.max_draft, "], got ", accepted.sizes());
  TORCH_CHECK(accepted.scalar_type() == at::kChar && accepted.is_contiguous() &&
                  accepted.device() == device,
              "accepted must be a contiguous int8 tensor on ", device);
  check_vector(num_accepted, "num_accepted", at::kLong, batch, device);
  check_vector(status, "status", at::kInt, batch, device);
  a.tokens = tokens.data_ptr<int64_t>();
  a.num_accepted = num_accepted.data_ptr<int64_t>();
  a.accepted = accepted.data_ptr<int8_t>();
  a.status = status.data_ptr<int32_t>();
  return a;
}

}  // namespace sampling_glue
}  // namespace specdec
