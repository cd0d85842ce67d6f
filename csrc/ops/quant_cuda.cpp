// CUDA glue of the `quant` family: W4A16 matmul (tensor-core kernel for M <= 16 per launch, dense
// dequantisation + cuBLAS for large M) and dequantisation, over LAYOUT_CUDA weights.
#include "ops/aten.h"
#include <ATen/ops/mm.h>  // at::mm_out
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels/quant/w4a16_cuda.h"
#include "ops/quant_common.h"

namespace specdec::ops {
namespace {

// From here on one dense dequantisation (N*K writes) plus a cuBLAS GEMM beats re-streaming the
// int4 weight once per 16 activation rows through the W4A16 kernel.
constexpr int64_t kDenseFromM = 64;

quant::ActDType act_dtype(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, name,
              " must be float16 or bfloat16 on CUDA; got ", t.scalar_type());
  return t.scalar_type() == at::kHalf ? quant::ActDType::kFloat16 : quant::ActDType::kBFloat16;
}

void check_cuda_weight(const at::Tensor& packed, const at::Tensor& scales, int64_t N, int64_t K, int64_t group,
                       at::ScalarType dtype) {
  const int64_t tiles = (N + quant::kCudaTileN - 1) / quant::kCudaTileN;
  const int64_t chunks = (K + quant::kCudaChunkK - 1) / quant::kCudaChunkK;
  // packed: (ceil(N/8), ceil(K/128), 128) int32
  TORCH_CHECK(packed.is_cuda() && packed.scalar_type() == at::kInt && packed.dim() == 3 && packed.size(0) == tiles &&
                  packed.size(1) == chunks && packed.size(2) == 128 && packed.is_contiguous(),
              "packed must be a contiguous int32 LAYOUT_CUDA tensor of shape [", tiles, ", ", chunks,
              ", 128] on CUDA for weight [", N, ", ", K, "]; got ", packed.scalar_type(), " ", packed.sizes(),
              " (a LAYOUT_CPU weight must be repacked for CUDA)");
  // scales: (ceil(N/8), K/group, 8); their dtype is the activation dtype the weight was packed for
  TORCH_CHECK(scales.is_cuda() && scales.dim() == 3 && scales.size(0) == tiles && scales.size(1) == K / group &&
                  scales.size(2) == quant::kCudaTileN && scales.is_contiguous(),
              "scales must be a contiguous [", tiles, ", ", K / group, ", 8] tensor on CUDA; got ", scales.sizes());
  TORCH_CHECK(scales.scalar_type() == dtype, "the weight is packed for ", scales.scalar_type(),
              " activations (the nibble interleave depends on the dtype) but x is ", dtype,
              "; repack it with quantize_w4(..., scale_dtype=", dtype, ") or specdec_cuda.ops.quant.repack_w4");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(packed.data_ptr()) % 16 == 0, "packed must be 16-byte aligned");
  TORCH_CHECK(reinterpret_cast<uintptr_t>(scales.data_ptr()) % 4 == 0, "scales must be 4-byte aligned");
}

void check_launch(cudaError_t err, const char* what, int64_t M, int64_t N, int64_t K, int64_t group) {
  TORCH_CHECK(err == cudaSuccess, what, " failed for M=", M, ", weight [", N, ", ", K, "], group ", group, ": ",
              cudaGetErrorString(err));
}

void w4_dequantize_cuda(const at::Tensor& packed, const at::Tensor& scales, int64_t group_size, int64_t layout,
                        at::Tensor& weight) {
  TORCH_CHECK(layout == kLayoutCuda, "w4_dequantize on CUDA takes LAYOUT_CUDA (1) weights; got layout ", layout);
  // weight: (N, K) of the scales' dtype or float32
  TORCH_CHECK(weight.is_cuda() && weight.dim() == 2 && weight.is_contiguous() && at::isFloatingType(weight.scalar_type()),
              "weight must be a contiguous floating [N, K] CUDA tensor; got ", weight.sizes());
  const int64_t N = weight.size(0), K = weight.size(1);
  const int64_t group = check_w4_shape(N, K, group_size);
  const quant::ActDType dt = act_dtype(scales, "scales");
  check_cuda_weight(packed, scales, N, K, group, scales.scalar_type());
  if (N == 0) return;
  const c10::cuda::CUDAGuard guard(weight.device());
  // The kernel writes 16-byte pieces: go through a fresh buffer unless weight is aligned and of the dtype.
  const bool direct = weight.scalar_type() == scales.scalar_type() &&
                      reinterpret_cast<uintptr_t>(weight.data_ptr()) % 16 == 0;
  at::Tensor dense = direct ? weight : at::empty({N, K}, weight.options().dtype(scales.scalar_type()));
  check_launch(quant::launch_w4_dequantize(packed.data_ptr<int32_t>(), scales.data_ptr(), dense.data_ptr(), N, K, group,
                                           dt, c10::cuda::getCurrentCUDAStream()),
               "w4_dequantize", 0, N, K, group);
  if (!dense.is_same(weight)) weight.copy_(dense);
}

// tuning: an entry of the kernel's launch-configuration table (w4a16_cuda.cu), or -1 for the
// automatic choice, which also takes the dense path from kDenseFromM rows on.
void w4a16_matmul_impl(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, int64_t group_size,
                       int64_t layout, int64_t tuning, at::Tensor& out) {
  TORCH_CHECK(layout == kLayoutCuda, "w4a16_matmul on CUDA takes LAYOUT_CUDA (1) weights; got layout ", layout);
  // x: (M, K); out: (M, N) of x's dtype
  TORCH_CHECK(x.is_cuda() && x.dim() == 2, "x must be a [M, K] CUDA tensor; got ", x.sizes());
  const quant::ActDType dt = act_dtype(x, "x");
  TORCH_CHECK(out.is_cuda() && out.dim() == 2 && out.size(0) == x.size(0) && out.scalar_type() == x.scalar_type() &&
                  out.is_contiguous(),
              "out must be a contiguous [M, N] CUDA tensor of x's dtype; got ", out.scalar_type(), " ", out.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  const int64_t group = check_w4_shape(N, K, group_size);
  check_cuda_weight(packed, scales, N, K, group, x.scalar_type());
  // Rows one launch takes: 16 for the automatic choice, else the tuning's own.
  int64_t slice = quant::kMmaMaxM;
  if (tuning >= 0) {
    TORCH_CHECK(tuning < quant::w4a16_mma_tuning_count(), "tuning must be -1 (automatic) or below ",
                quant::w4a16_mma_tuning_count(), "; got ", tuning);
    slice = quant::w4a16_mma_tuning(static_cast<int>(tuning)).rows;
  }
  if (M == 0 || N == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  if (tuning < 0 && M >= kDenseFromM) {
    at::Tensor dense = at::empty({N, K}, x.options());
    check_launch(quant::launch_w4_dequantize(packed.data_ptr<int32_t>(), scales.data_ptr(), dense.data_ptr(), N, K,
                                             group, dt, c10::cuda::getCurrentCUDAStream()),
                 "w4_dequantize", M, N, K, group);
    at::mm_out(out, x, dense.t());
    return;
  }
  // The kernel reads x rows with 16-byte copies: contiguous rows (K % 32 == 0) from an aligned base.
  at::Tensor xc = x.contiguous();
  if (reinterpret_cast<uintptr_t>(xc.data_ptr()) % 16 != 0) xc = xc.clone();
  const int64_t elem = xc.element_size();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  for (int64_t m0 = 0; m0 < M; m0 += slice) {
    const int64_t rows = std::min<int64_t>(slice, M - m0);
    check_launch(quant::launch_w4a16_mma(static_cast<const char*>(xc.data_ptr()) + m0 * K * elem, K,
                                         packed.data_ptr<int32_t>(), scales.data_ptr(),
                                         static_cast<char*>(out.data_ptr()) + m0 * N * elem, N, rows, N, K, group, dt,
                                         stream, static_cast<int>(tuning)),
                 "w4a16_matmul", M, N, K, group);
  }
}

void w4a16_matmul_cuda(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, int64_t group_size,
                       int64_t layout, at::Tensor& out) {
  w4a16_matmul_impl(x, packed, scales, group_size, layout, -1, out);
}

void w4a16_matmul_tuned_cuda(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                             int64_t group_size, int64_t tuning, at::Tensor& out) {
  w4a16_matmul_impl(x, packed, scales, group_size, kLayoutCuda, tuning, out);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("w4a16_matmul", &w4a16_matmul_cuda);
  m.impl("w4_dequantize", &w4_dequantize_cuda);
  m.impl("_w4a16_matmul_tuned", &w4a16_matmul_tuned_cuda);
}

}  // namespace specdec::ops
