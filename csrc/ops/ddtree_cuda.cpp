// CUDA glue of the ddtree family: the same checks as the CPU glue, then the launcher in
// kernels/ddtree/ddtree_cuda.cu on the current stream. Nothing here synchronises with the device.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>
#include "ops/aten.h"

#include <cuda_runtime.h>

#include "kernels/ddtree/ddtree.h"
#include "ops/ddtree_common.h"

namespace specdec {
namespace {

void ddtree_build_cuda(const at::Tensor& topk_logprobs, const at::Tensor& topk_tokens,
                       const at::Tensor& max_depth, int64_t budget, at::Tensor& tokens,
                       at::Tensor& parents, at::Tensor& depth, at::Tensor& num_nodes,
                       at::Tensor& tree_mask, at::Tensor& status) {
  const c10::cuda::CUDAGuard guard(topk_logprobs.device());
  at::Tensor scores, ints;  // workspaces, freed after the launch in stream order
  const ddtree::BuildArgs a = ddtree_ops::build_args(topk_logprobs, topk_tokens, max_depth, budget,
                                                     tokens, parents, depth, num_nodes, tree_mask,
                                                     status, scores, ints);
  const int err = ddtree::build_cuda(a, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == 0, "ddtree_build: CUDA launch failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_IMPL(specdec, CUDA, m) { m.impl("ddtree_build", &specdec::ddtree_build_cuda); }
