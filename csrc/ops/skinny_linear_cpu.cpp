// CPU glue of the `skinny_linear` family: shape / dtype checks, then the output features split
// over torch's threads (kernel: csrc/kernels/skinny_linear/skinny_linear_cpu.cpp). CPU only: on
// CUDA the callers use F.linear (cuBLAS streams the weight once for a few rows already).
#include "ops/aten.h"
#include <torch/library.h>

#include "kernels/skinny_linear/packed_cpu.h"
#include "kernels/skinny_linear/skinny_linear_cpu.h"
#include "ops/packed_linear.h"
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

void skinny_linear_packed_cpu(const at::Tensor& x, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
                              at::Tensor& out, bool rounded) {
  // x: (..., K) float32; packed: (P, K, kPanel) float32 or bfloat16 with P = ceil(N / kPanel);
  // bias: (N,) float32 or None; out: (..., N) float32, the same leading dims as x; rounded: x
  // rounded to bfloat16 for bfloat16 panels on the AMX tier (packed_cpu.h; the FMA tiers ignore it)
  TORCH_CHECK(x.dim() >= 1 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "skinny_linear_packed: x must be a contiguous float32 [..., K] tensor; got ", x.scalar_type(), " ",
              x.sizes());
  const int64_t K = x.size(-1), M = K == 0 ? 0 : x.numel() / K;
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) == K && packed.size(2) == skinny::kPanel &&
                  (packed.scalar_type() == at::kFloat || packed.scalar_type() == at::kBFloat16) &&
                  packed.is_contiguous(),
              "skinny_linear_packed: packed must be a contiguous float32 or bfloat16 [panels, K=", K, ", ",
              skinny::kPanel, "] tensor; got ", packed.scalar_type(), " ", packed.sizes());
  TORCH_CHECK(out.dim() == x.dim() && out.sizes().slice(0, x.dim() - 1) == x.sizes().slice(0, x.dim() - 1) &&
                  out.scalar_type() == at::kFloat && out.is_contiguous(),
              "skinny_linear_packed: out must be a contiguous float32 [..., N] tensor with x's leading dims ",
              x.sizes().slice(0, x.dim() - 1), "; got ", out.scalar_type(), " ", out.sizes());
  const int64_t N = out.size(-1), P = packed.size(0);
  TORCH_CHECK(P == (N + skinny::kPanel - 1) / skinny::kPanel,
              "skinny_linear_packed: out has N=", N, " columns but packed holds ", P, " panels of ", skinny::kPanel,
              " (N must be in (", (P - 1) * skinny::kPanel, ", ", P * skinny::kPanel, "])");
  if (bias.has_value())
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == N && bias->scalar_type() == at::kFloat && bias->is_contiguous(),
                "skinny_linear_packed: bias must be a contiguous float32 [", N, "] tensor; got ",
                bias->scalar_type(), " ", bias->sizes());
  if (M == 0 || N == 0) return;
  packed_linear(x.data_ptr<float>(), M, K, packed, bias.has_value() ? bias->data_ptr<float>() : nullptr,
                out.data_ptr<float>(), N, rounded);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("skinny_linear", &skinny_linear_cpu);
  m.impl("skinny_linear_packed", &skinny_linear_packed_cpu);
}

}  // namespace specdec::ops
