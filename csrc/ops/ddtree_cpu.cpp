// CPU glue of the ddtree family: check, pack arguments, spread batch rows over threads.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include "ops/aten.h"

#include "kernels/ddtree/ddtree.h"
#include "ops/ddtree_common.h"

namespace specdec {
namespace {

void ddtree_build_cpu(const at::Tensor& topk_logprobs, const at::Tensor& topk_tokens,
                      const at::Tensor& max_depth, int64_t budget, at::Tensor& tokens,
                      at::Tensor& parents, at::Tensor& depth, at::Tensor& num_nodes,
                      at::Tensor& tree_mask, at::Tensor& status) {
  at::Tensor scores, ints;
  const ddtree::BuildArgs a = ddtree_ops::build_args(topk_logprobs, topk_tokens, max_depth, budget,
                                                     tokens, parents, depth, num_nodes, tree_mask,
                                                     status, scores, ints);
  at::parallel_for(0, a.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) ddtree::build_row_cpu(a, b);
  });
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("ddtree_build", &specdec::ddtree_build_cpu); }
