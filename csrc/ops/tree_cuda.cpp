// CUDA glue of the tree family: the same checks as the CPU glue, then the launchers in
// kernels/tree/tree_cuda.cu on the current stream. Nothing here synchronises with the device.
// Only c10's stream / guard headers: ATen/cuda/CUDAContext.h pulls in cusparse.h, which slim
// toolkits (this CI's among them) do not ship.
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>
#include "ops/aten.h"

#include <cuda_runtime.h>

#include <vector>

#include "kernels/tree/lookahead_mask.h"
#include "kernels/tree/tree.h"
#include "ops/lookahead_mask_common.h"
#include "ops/tree_common.h"

namespace specdec {
namespace {

void check_launch(int err, const char* op) {
  TORCH_CHECK(err == 0, op, ": CUDA launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void build_tree_cuda(const at::Tensor& parents, const at::Tensor& cu_num_nodes,
                     const at::Tensor& cache_len, int64_t max_prefix, at::Tensor& depth,
                     at::Tensor& positions, at::Tensor& tree_mask, at::Tensor& packed_mask,
                     at::Tensor& first_child, at::Tensor& next_sibling,
                     const std::optional<at::Tensor>& hf_mask, at::Tensor& status) {
  const c10::cuda::CUDAGuard guard(parents.device());
  const tree::BuildTreeArgs a =
      tree_ops::build_args(parents, cu_num_nodes, cache_len, max_prefix, depth, positions,
                           tree_mask, packed_mask, first_child, next_sibling, hf_mask, status);
  check_launch(tree::build_tree_cuda(a, c10::cuda::getCurrentCUDAStream().stream()), "build_tree");
}

void verify_tree_cuda(const at::Tensor& draft_tokens, const at::Tensor& parents,
                      const at::Tensor& cu_num_nodes, const at::Tensor& target_logits,
                      const std::optional<at::Tensor>& draft_logits, const at::Tensor& temperature,
                      const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& seed,
                      const at::Tensor& position, at::Tensor& tokens, at::Tensor& accepted_nodes,
                      at::Tensor& num_accepted, at::Tensor& status) {
  const c10::cuda::CUDAGuard guard(parents.device());
  tree::VerifyTreeArgs a = tree_ops::verify_args(
      draft_tokens, parents, cu_num_nodes, target_logits, draft_logits, temperature, top_k, top_p,
      seed, position, tokens, accepted_nodes, num_accepted, status);
  // workspace: (B, V) float32, the adjusted target probabilities of SpecInfer rows.
  at::Tensor workspace;
  if (a.draft_logits != nullptr && a.batch > 0) {
    workspace = at::empty({a.batch, a.vocab}, target_logits.options().dtype(at::kFloat));
    a.workspace = workspace.data_ptr<float>();
  }
  check_launch(tree::verify_tree_cuda(a, c10::cuda::getCurrentCUDAStream().stream()),
               "verify_tree");
}

void compact_kv_cuda(at::TensorList caches, const at::Tensor& accepted_nodes,
                     const at::Tensor& num_accepted, const at::Tensor& src_start,
                     const at::Tensor& dst_start, at::Tensor& status) {
  const c10::cuda::CUDAGuard guard(accepted_nodes.device());
  const tree::CompactArgs a =
      tree_ops::compact_args(caches, accepted_nodes, num_accepted, src_start, dst_start, status);
  std::vector<char*> ptrs;
  ptrs.reserve(caches.size());
  for (const at::Tensor& c : caches) ptrs.push_back(static_cast<char*>(c.data_ptr()));
  check_launch(tree::compact_kv_cuda(a, ptrs.data(), static_cast<int64_t>(ptrs.size()),
                                     c10::cuda::getCurrentCUDAStream().stream()),
               "compact_kv");
}

void lookahead_mask_cuda(const at::Tensor& cache_len, const at::Tensor& guess_lens,
                         int64_t guess_len, int64_t window, int64_t levels, at::Tensor& positions,
                         at::Tensor& tree_mask, at::Tensor& status) {
  const c10::cuda::CUDAGuard guard(cache_len.device());
  const tree::LookaheadMaskArgs a = tree_ops::lookahead_mask_args(
      cache_len, guess_lens, guess_len, window, levels, positions, tree_mask, status);
  check_launch(tree::lookahead_mask_cuda(a, c10::cuda::getCurrentCUDAStream().stream()),
               "lookahead_mask");
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("build_tree", &specdec::build_tree_cuda);
  m.impl("verify_tree", &specdec::verify_tree_cuda);
  m.impl("compact_kv", &specdec::compact_kv_cuda);
  m.impl("lookahead_mask", &specdec::lookahead_mask_cuda);
}
