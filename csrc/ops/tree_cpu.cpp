// CPU glue of the tree family: check, pack arguments, spread batch rows over threads.
#include <ATen/Parallel.h>
#include <torch/library.h>
#include "ops/aten.h"

#include "kernels/common/status.h"
#include "kernels/tree/compact.h"
#include "kernels/tree/lookahead_mask.h"
#include "kernels/tree/tree.h"
#include "ops/lookahead_mask_common.h"
#include "ops/tree_common.h"

namespace specdec {
namespace {

void build_tree_cpu(const at::Tensor& parents, const at::Tensor& cu_num_nodes,
                    const at::Tensor& cache_len, int64_t max_prefix, at::Tensor& depth,
                    at::Tensor& positions, at::Tensor& tree_mask, at::Tensor& packed_mask,
                    at::Tensor& first_child, at::Tensor& next_sibling,
                    const std::optional<at::Tensor>& hf_mask, at::Tensor& status) {
  const tree::BuildTreeArgs a =
      tree_ops::build_args(parents, cu_num_nodes, cache_len, max_prefix, depth, positions,
                           tree_mask, packed_mask, first_child, next_sibling, hf_mask, status);
  at::parallel_for(0, a.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) tree::build_tree_row_cpu(a, b);
  });
}

void verify_tree_cpu(const at::Tensor& draft_tokens, const at::Tensor& parents,
                     const at::Tensor& cu_num_nodes, const at::Tensor& target_logits,
                     const std::optional<at::Tensor>& draft_logits, const at::Tensor& temperature,
                     const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& seed,
                     const at::Tensor& position, at::Tensor& tokens, at::Tensor& accepted_nodes,
                     at::Tensor& num_accepted, at::Tensor& status) {
  tree::VerifyTreeArgs a = tree_ops::verify_args(
      draft_tokens, parents, cu_num_nodes, target_logits, draft_logits, temperature, top_k, top_p,
      seed, position, tokens, accepted_nodes, num_accepted, status);
  if (a.batch == 0) return;
  // workspace: (B, 4, V) float32 — scaled target row, scaled draft row, adjusted target
  // probabilities, draft probabilities.
  at::Tensor workspace = at::empty({a.batch, 4, a.vocab}, parents.options().dtype(at::kFloat));
  float* ws = workspace.data_ptr<float>();
  at::parallel_for(0, a.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      tree::VerifyTreeArgs row = a;
      row.workspace = ws + b * 4 * a.vocab;
      tree::verify_tree_row_cpu(row, b);
    }
  });
}

void compact_kv_cpu(at::TensorList caches, const at::Tensor& accepted_nodes,
                    const at::Tensor& num_accepted, const at::Tensor& src_start,
                    const at::Tensor& dst_start, at::Tensor& status) {
  const tree::CompactArgs a =
      tree_ops::compact_args(caches, accepted_nodes, num_accepted, src_start, dst_start, status);
  for (int64_t b = 0; b < a.batch; ++b) tree::compact_row_ok(a, b);
  if (caches.empty()) return;
  const int64_t num = static_cast<int64_t>(caches.size());
  // One task per (cache tensor, row): rows and tensors never share bytes.
  at::parallel_for(0, num * a.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t b = i % a.batch;
      if (a.status[b] != kStatusOk || a.accepted_nodes[b * a.width] < 0) continue;
      tree::compact_row_cpu(a, b, static_cast<char*>(caches[i / a.batch].data_ptr()));
    }
  });
}

void lookahead_mask_cpu(const at::Tensor& cache_len, const at::Tensor& guess_lens,
                        int64_t guess_len, int64_t window, int64_t levels, at::Tensor& positions,
                        at::Tensor& tree_mask, at::Tensor& status) {
  const tree::LookaheadMaskArgs a = tree_ops::lookahead_mask_args(
      cache_len, guess_lens, guess_len, window, levels, positions, tree_mask, status);
  at::parallel_for(0, a.batch, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) tree::lookahead_mask_row_cpu(a, b);
  });
}

}  // namespace
}  // namespace specdec

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("build_tree", &specdec::build_tree_cpu);
  m.impl("verify_tree", &specdec::verify_tree_cpu);
  m.impl("compact_kv", &specdec::compact_kv_cpu);
  m.impl("lookahead_mask", &specdec::lookahead_mask_cpu);
}
