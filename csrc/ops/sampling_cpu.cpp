// CPU glue of `sample` and `verify_chain`: checks, packing, at::parallel_for over rows / positions.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "kernels/sampling/sampling_cpu.h"
#include "ops/sampling_common.h"

namespace {

using specdec::sampling::PositionResult;
using specdec::sampling::VerifyArgs;

void sample_cpu_op(const at::Tensor& logits, const at::Tensor& temperature, const at::Tensor& top_k,
                   const at::Tensor& top_p, const at::Tensor& seed, const at::Tensor& position,
                   int64_t purpose, int64_t substream, const at::Tensor& tokens,
                   const at::Tensor& status) {
  const auto a = specdec::sampling_glue::sample_args(logits, temperature, top_k, top_p, seed,
                                                     position, purpose, substream, tokens, status);
  at::parallel_for(0, a.rows, 1, [&](int64_t begin, int64_t end) {
    specdec::sampling::sample_cpu(a, begin, end);
  });
}

// cu_num_draft lives on the host here, so its layout is checked with a readable error (the kernels
// still guard every row, as the CUDA path must without a host sync).
void check_layout_on_host(const VerifyArgs& a) {
  TORCH_CHECK(a.cu_num_draft[0] == 0, "cu_num_draft[0] must be 0, got ", a.cu_num_draft[0]);
  // Each entry in range first, so that the differences below cannot overflow.
  for (int64_t i = 0; i <= a.batch; ++i)
    TORCH_CHECK(a.cu_num_draft[i] >= 0 && a.cu_num_draft[i] <= a.num_drafts, "cu_num_draft[", i,
                "] = ", a.cu_num_draft[i], " is outside [0, ", a.num_drafts, "] (the number of draft tokens)");
  for (int64_t i = 0; i < a.batch; ++i) {
    const int64_t k = a.cu_num_draft[i + 1] - a.cu_num_draft[i];
    TORCH_CHECK(k >= 0, "cu_num_draft must be non-decreasing, got ", a.cu_num_draft[i], " then ",
                a.cu_num_draft[i + 1], " at row ", i);
    TORCH_CHECK(k <= a.max_draft, "row ", i, " has ", k, " drafts but max_draft is ", a.max_draft);
  }
  TORCH_CHECK(a.cu_num_draft[a.batch] == a.num_drafts, "cu_num_draft[-1] must equal the number of ",
              "draft tokens ", a.num_drafts, ", got ", a.cu_num_draft[a.batch]);
}

// Measured on the CPU (bench/bench_sampling.py): parallel evaluates every position, including the
// rejected tails and their residual races, so it loses to serial (several times at k = 8) as soon
// as the rows alone occupy the threads. It only wins when every position fits into one wave of
// threads, where it costs one position's time against serial's (accepted + 1).
bool use_parallel(const VerifyArgs& a, int64_t strategy) {
  if (strategy == 1) return true;
  if (strategy == 2) return false;
  return a.num_drafts + a.batch <= at::get_num_threads();
}

void verify_chain_cpu_op(const at::Tensor& draft_tokens, const at::Tensor& cu_num_draft,
                         const at::Tensor& target_logits,
                         const std::optional<at::Tensor>& draft_logits,
                         const at::Tensor& temperature, const at::Tensor& top_k,
                         const at::Tensor& top_p, const at::Tensor& seed,
                         const at::Tensor& position, bool typical, double typical_epsilon,
                         double typical_alpha, int64_t strategy, const at::Tensor& tokens,
                         const at::Tensor& num_accepted, const at::Tensor& accepted,
                         const at::Tensor& status) {
  TORCH_CHECK(strategy >= 0 && strategy <= 2, "strategy must be 0 (auto), 1 (parallel) or 2 ",
              "(serial), got ", strategy);
  const VerifyArgs a = specdec::sampling_glue::verify_args(
      draft_tokens, cu_num_draft, target_logits, draft_logits, temperature, top_k, top_p, seed,
      position, typical, typical_epsilon, typical_alpha, tokens, num_accepted, accepted, status);
  check_layout_on_host(a);
  if (!use_parallel(a, strategy)) {
    at::parallel_for(0, a.batch, 1, [&](int64_t begin, int64_t end) {
      specdec::sampling::verify_chain_serial_cpu(a, begin, end);
    });
    return;
  }
  const int64_t num_targets = a.num_drafts + a.batch;
  std::vector<int64_t> row_of_target(num_targets, -1);
  for (int64_t i = 0; i < a.batch; ++i) {
    for (int64_t t = a.cu_num_draft[i] + i; t <= a.cu_num_draft[i + 1] + i; ++t) row_of_target[t] = i;
  }
  std::vector<PositionResult> results(num_targets);
  at::parallel_for(0, num_targets, 1, [&](int64_t begin, int64_t end) {
    specdec::sampling::verify_chain_positions_cpu(a, row_of_target.data(), begin, end,
                                                  results.data());
  });
  specdec::sampling::verify_chain_walk_cpu(a, results.data(), 0, a.batch);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("sample", &sample_cpu_op);
  m.impl("verify_chain", &verify_chain_cpu_op);
}
