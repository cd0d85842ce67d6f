// The mtp_head_topk_packed op's CPU implementation, for glue that ends in an LM head's top-k (the
// DFlash drafter's block, ops/dflash_cpu.cpp) without a trip through the dispatcher.
#pragma once

#include "ops/aten.h"

#include <optional>

namespace specdec::ops {

// Arguments and shapes as the mtp_head_topk_packed op's schema (ops/schema.cpp) gives them; checks them.
void mtp_head_topk_packed_cpu(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& panels,
                              int64_t vocab_size, double eps, at::Tensor& values, at::Tensor& indices,
                              std::optional<at::Tensor> logits, at::Tensor& status, std::optional<at::Tensor> lse);

}  // namespace specdec::ops
