// CPU glue of the `skinny_linear` family: shape / dtype checks, then the output features split
// over torch's threads (kernel: csrc/kernels/skinny_linear/skinny_linear_cpu.cpp). CPU only: on
// CUDA the callers use F.linear (cuBLAS streams the weight once for a few rows already).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "kernels/skinny_linear/skinny_linear_cpu.h"
#include "ops/quant_parallel.h"

namespace specdec::ops {
namespace {

void skinny_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::Tensor& out) {
  // x: (M, K) float32; weight: (N, K) float32; bias: (N,) float32 or None; out: (M, N) float32
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "skinny_linear: x must be a contiguous float32 [M, K] tensor; got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat && weight.is_contiguous() &&
                  weight.size(1) == x.size(1),
              "skinny_linear: weight must be a contiguous float32 [N, K=", x.size(1), "] tensor; got ",
              weight.scalar_type(), " ", weight.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  if (bias.has_value())
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == at::kFloat && bias->is_contiguous(),
                "skinny_linear: bias must be a contiguous float32 [", N, "] tensor; got ", bias->scalar_type(), " ",
                bias->sizes());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == M && out.size(1) == N && out.scalar_type() == at::kFloat &&
                  out.is_contiguous(),
              "skinny_linear: out must be a contiguous float32 [", M, ", ", N, "] tensor; got ", out.scalar_type(),
              " ", out.sizes());
  if (M == 0 || N == 0) return;
  const float* b = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  // Output features are independent; 256 of them are 256 * K * 4 bytes of weight (2 MiB at
  // K = 2048), worth a thread start.
  parallel_range(0, N, 256, [&](int64_t begin, int64_t end) {
    skinny::skinny_linear_cpu_rows(x.data_ptr<float>(), M, K, weight.data_ptr<float>(), b, out.data_ptr<float>(), N,
                                   begin, end);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("skinny_linear", &skinny_linear_cpu); }

}  // namespace specdec::ops
