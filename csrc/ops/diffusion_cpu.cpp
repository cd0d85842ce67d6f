// CPU glue of `diffusion_unmask`: checks, packing, at::parallel_for over positions then rows.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "kernels/diffusion/diffusion_cpu.h"
#include "ops/diffusion_common.h"

namespace {

void diffusion_unmask_cpu_op(const at::Tensor& logits, const at::Tensor& tokens, int64_t mask_id,
                             const at::Tensor& temperature, const at::Tensor& top_k,
                             const at::Tensor& top_p, const at::Tensor& seed,
                             const at::Tensor& position, const at::Tensor& step,
                             const at::Tensor& num_transfer, const at::Tensor& threshold,
                             const at::Tensor& sampled, const at::Tensor& confidence,
                             const at::Tensor& keep, const at::Tensor& status) {
  // position_status: (batch, width) int32, step 1's per-position statuses
  const at::Tensor position_status =
      at::empty({tokens.size(0), tokens.size(1)}, tokens.options().dtype(at::kInt));
  const auto a = specdec::diffusion_glue::unmask_args(
      logits, tokens, mask_id, temperature, top_k, top_p, seed, position, step, num_transfer,
      threshold, sampled, confidence, keep, status, position_status);
  for (int64_t b = 0; b < a.batch; ++b) {
    const int64_t s = a.step[b];
    TORCH_CHECK(s >= 0 && s < (int64_t{1} << 24), "step must be in [0, 2^24), got ", s, " at row ", b);
  }
  at::parallel_for(0, a.batch * a.width, 1, [&](int64_t begin, int64_t end) {
    specdec::diffusion::unmask_positions_cpu(a, begin, end);
  });
  at::parallel_for(0, a.batch, 1, [&](int64_t begin, int64_t end) {
    specdec::diffusion::unmask_select_cpu(a, begin, end);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("diffusion_unmask", &diffusion_unmask_cpu_op); }
