// Argument checks and kernel-argument packing shared by ddtree_cpu.cpp and ddtree_cuda.cpp.
#pragma once

#include "ops/aten.h"

#include <utility>

#include "kernels/ddtree/ddtree.h"

namespace specdec {
namespace ddtree_ops {

inline void check(const at::Tensor& t, const char* name, at::ScalarType dtype, at::IntArrayRef shape,
                  const at::Device& device) {
  TORCH_CHECK(t.sizes() == shape, name, ": expected shape ", shape, ", got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == dtype, name, ": expected dtype ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.device() == device, name, ": expected device ", device, ", got ", t.device());
  TORCH_CHECK(t.is_contiguous(), name, ": must be contiguous");
}

// Checks every tensor and packs the arguments; `scores` / `ints` are the workspaces allocated here
// (kept alive by the caller until the kernel has run).
inline ddtree::BuildArgs build_args(const at::Tensor& topk_logprobs, const at::Tensor& topk_tokens,
                                    const at::Tensor& max_depth, int64_t budget, at::Tensor& tokens,
                                    at::Tensor& parents, at::Tensor& depth, at::Tensor& num_nodes,
                                    at::Tensor& tree_mask, at::Tensor& status, at::Tensor& scores,
                                    at::Tensor& ints) {
  TORCH_CHECK(topk_logprobs.dim() == 3, "topk_logprobs: expected shape (B, D, K), got ",
              topk_logprobs.sizes());
  const int64_t B = topk_logprobs.size(0), D = topk_logprobs.size(1), K = topk_logprobs.size(2);
  TORCH_CHECK(budget >= 0, "budget: must be >= 0, got ", budget);
  // The workspace indexes int32 lanes: keep M well inside.
  TORCH_CHECK(budget < (int64_t(1) << 24), "budget: must be < 2^24, got ", budget);
  const at::Device dev = topk_logprobs.device();
  check(topk_logprobs, "topk_logprobs", at::kFloat, {B, D, K}, dev);  // (B, D, K) float32
  check(topk_tokens, "topk_tokens", at::kLong, {B, D, K}, dev);       // (B, D, K) int64
  check(max_depth, "max_depth", at::kLong, {B}, dev);                 // (B,) int64
  check(tokens, "tokens", at::kLong, {B, budget}, dev);               // (B, M) int64
  check(parents, "parents", at::kLong, {B, budget}, dev);             // (B, M) int64
  check(depth, "depth", at::kLong, {B, budget}, dev);                 // (B, M) int64
  check(num_nodes, "num_nodes", at::kLong, {B}, dev);                 // (B,) int64
  check(tree_mask, "tree_mask", at::kBool, {B, budget + 1, budget + 1}, dev);  // (B, M+1, M+1)
  check(status, "status", at::kInt, {B}, dev);                        // (B,) int32
  scores = at::empty({B, 2 * (budget + 1)}, topk_logprobs.options().dtype(at::kDouble));
  ints = at::empty({B, ddtree::kHeapInts * (budget + 1)}, topk_logprobs.options().dtype(at::kInt));
  ddtree::BuildArgs a;
  a.topk_logprobs = topk_logprobs.data_ptr<float>();
  a.topk_tokens = topk_tokens.data_ptr<int64_t>();
  a.max_depth = max_depth.data_ptr<int64_t>();
  a.batch = B; a.depths = D; a.width = K; a.budget = budget;
  a.tokens = tokens.data_ptr<int64_t>();
  a.parents = parents.data_ptr<int64_t>();
  a.depth = depth.data_ptr<int64_t>();
  a.num_nodes = num_nodes.data_ptr<int64_t>();
  a.tree_mask = reinterpret_cast<uint8_t*>(tree_mask.data_ptr<bool>());
  a.status = status.data_ptr<int32_t>();
  a.heap_scores = scores.data_ptr<double>();
  a.heap_ints = ints.data_ptr<int32_t>();
  return a;
}

}  // namespace ddtree_ops
}  // namespace specdec
