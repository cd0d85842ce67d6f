// CPU glue of the `quant` family: W4A16 matmul and dequantisation over LAYOUT_CPU weights.
#include "ops/aten.h"
#include <ATen/ops/matmul.h>
#include <torch/library.h>

#include "kernels/quant/w4_cpu.h"
#include "ops/quant_common.h"
#include "ops/quant_parallel.h"

namespace specdec::ops {
namespace {

using quant::kCpuTileN;

// From this many activation rows on, one dense dequantisation + BLAS beats re-reading the int4
// tiles per 8 rows (the dequantised weight is written once and the GEMM is compute-bound).
constexpr int64_t kDenseFromM = 64;

void check_cpu_weight(const at::Tensor& packed, const at::Tensor& scales, int64_t N, int64_t K,
                      int64_t group) {
  const int64_t tiles = (N + kCpuTileN - 1) / kCpuTileN;
  // packed: (ceil(N/16), K/2, 16) uint8
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.size(0) == tiles &&
                  packed.size(1) == K / 2 && packed.size(2) == kCpuTileN,
              "packed must be a uint8 LAYOUT_CPU tensor of shape [", tiles, ", ", K / 2, ", 16] for N=", N,
              ", K=", K, "; got ", packed.scalar_type(), " ", packed.sizes(),
              " (a LAYOUT_CUDA weight must be repacked with quantize_w4(..., device='cpu'))");
  // scales: (ceil(N/16), K/group, 16) float32
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 3 && scales.size(0) == tiles &&
                  scales.size(1) == K / group && scales.size(2) == kCpuTileN,
              "scales must be float32 of shape [", tiles, ", ", K / group, ", 16]; got ",
              scales.scalar_type(), " ", scales.sizes());
  TORCH_CHECK(packed.is_contiguous() && scales.is_contiguous(), "packed and scales must be contiguous");
}

void w4_dequantize_cpu(const at::Tensor& packed, const at::Tensor& scales, int64_t group_size,
                       int64_t layout, at::Tensor& weight) {
  TORCH_CHECK(layout == kLayoutCpu, "w4_dequantize on CPU takes LAYOUT_CPU (0) weights; got layout ", layout);
  // weight: (N, K) float
  TORCH_CHECK(weight.dim() == 2 && weight.is_contiguous() && at::isFloatingType(weight.scalar_type()),
              "weight must be a contiguous floating [N, K] tensor; got ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t group = check_w4_shape(N, K, group_size);
  check_cpu_weight(packed, scales, N, K, group);
  at::Tensor dense = weight.scalar_type() == at::kFloat ? weight : at::empty({N, K}, weight.options().dtype(at::kFloat));
  const int64_t tiles = (N + kCpuTileN - 1) / kCpuTileN;
  parallel_range(0, tiles, 8, [&](int64_t b, int64_t e) {
    quant::w4_dequantize_cpu_tiles(packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), K, group,
                                   dense.data_ptr<float>(), N, b, e);
  });
  if (!dense.is_same(weight)) weight.copy_(dense);
}

void w4a16_matmul_cpu(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                      int64_t group_size, int64_t layout, at::Tensor& out) {
  TORCH_CHECK(layout == kLayoutCpu, "w4a16_matmul on CPU takes LAYOUT_CPU (0) weights; got layout ", layout);
  // x: (M, K); out: (M, N), both of x's dtype
  TORCH_CHECK(x.dim() == 2, "x must be [M, K]; got ", x.sizes());
  // Integer / bool activations would come back as truncated integers: an error, as in nn.Linear.
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kHalf || x.scalar_type() == at::kBFloat16,
              "x must be float32, float16 or bfloat16; got ", x.scalar_type());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.scalar_type() == x.scalar_type() &&
                  out.is_contiguous(),
              "out must be a contiguous [M, N] tensor of x's dtype; got ", out.scalar_type(), " ", out.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  const int64_t group = check_w4_shape(N, K, group_size);
  check_cpu_weight(packed, scales, N, K, group);
  if (M == 0 || N == 0) return;
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  if (M >= kDenseFromM) {
    at::Tensor dense = at::empty({N, K}, x.options().dtype(at::kFloat));
    w4_dequantize_cpu(packed, scales, group_size, layout, dense);
    out.copy_(at::matmul(xf, dense.t()));
    return;
  }
  at::Tensor yf = out.scalar_type() == at::kFloat ? out : at::empty({M, N}, x.options().dtype(at::kFloat));
  const int64_t tiles = (N + kCpuTileN - 1) / kCpuTileN;
  // Output columns (tiles of 16 rows of W) are independent; 32 tiles per chunk is at least
  // 32 * 16 * K / 2 bytes of weight (256 KiB at K = 1024), worth a thread start.
  parallel_range(0, tiles, 32, [&](int64_t b, int64_t e) {
    quant::w4a16_matmul_cpu_tiles(xf.data_ptr<float>(), M, K, packed.data_ptr<uint8_t>(),
                                  scales.data_ptr<float>(), group, yf.data_ptr<float>(), N, b, e);
  });
  if (!yf.is_same(out)) out.copy_(yf);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("w4a16_matmul", &w4a16_matmul_cpu);
  m.impl("w4_dequantize", &w4_dequantize_cpu);
}

}  // namespace specdec::ops
