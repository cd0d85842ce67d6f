// CUDA glue of the `gguf` family: the warp-per-row matmul for the few rows of decoding and
// verification, dense dequantisation + cuBLAS from kDenseFromM rows on, and dequantisation
// (kernels: csrc/kernels/gguf/gguf_cuda.cu).
#include "ops/aten.h"
#include <ATen/ops/mm.h>  // at::mm_out
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels/gguf/gguf_cuda.h"
#include "ops/gguf_common.h"

namespace specdec::ops {
namespace {

// From here on one dequantisation (N * K writes) plus a cuBLAS GEMM beats the warp kernel, which
// re-reads the weight for every 8 rows of x. (Rows of a dense-path call get cuBLAS's order.)
constexpr int64_t kDenseFromM = 64;

gguf::Elem elem_of(const at::Tensor& t, const char* op, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return gguf::Elem::kFloat32;
    case at::kHalf: return gguf::Elem::kFloat16;
    case at::kBFloat16: return gguf::Elem::kBFloat16;
    default:
      TORCH_CHECK(false, op, ": ", name, " must be float32, float16 or bfloat16; got ", t.scalar_type());
      return gguf::Elem::kFloat32;
  }
}

void check_launch(cudaError_t err, const char* what, int64_t type, int64_t M, int64_t N, int64_t K) {
  TORCH_CHECK(err == cudaSuccess, what, " failed for ", gguf_type_name(type), " weight [", N, ", ", K, "], M=", M, ": ",
              cudaGetErrorString(err));
}

void gguf_dequantize_cuda(const at::Tensor& weight, int64_t type, at::Tensor& out) {
  // weight: GGUF blocks of W (N, K) on CUDA; out: (N, K) float32 / float16 / bfloat16 on the same device
  TORCH_CHECK(out.is_cuda() && weight.is_cuda() && out.device() == weight.device(), "gguf_dequantize: weight (",
              weight.device(), ") and out (", out.device(), ") must be on one CUDA device");
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous(), "gguf_dequantize: out must be a contiguous [N, K] tensor; got ",
              out.sizes());
  const gguf::Elem elem = elem_of(out, "gguf_dequantize", "out");
  const int64_t N = out.size(0), K = out.size(1);
  check_gguf_weight("gguf_dequantize", weight, type, N, K);
  if (N == 0) return;
  const c10::cuda::CUDAGuard guard(out.device());
  check_launch(gguf::launch_gguf_dequantize(static_cast<int32_t>(type), weight.data_ptr<uint8_t>(), N, K,
                                            out.data_ptr(), elem, c10::cuda::getCurrentCUDAStream()),
               "gguf_dequantize", type, 0, N, K);
}

void gguf_matmul_cuda(const at::Tensor& x, const at::Tensor& weight, int64_t type, at::Tensor& out) {
  // x: (M, K) float32 / float16 / bfloat16; weight: GGUF blocks of W (N, K); out: (M, N) of x's dtype
  TORCH_CHECK(x.is_cuda() && weight.is_cuda() && out.is_cuda() && weight.device() == x.device() &&
                  out.device() == x.device(),
              "gguf_matmul: x (", x.device(), "), weight (", weight.device(), ") and out (", out.device(),
              ") must be on one CUDA device");
  TORCH_CHECK(x.dim() == 2, "gguf_matmul: x must be [M, K]; got ", x.sizes());
  const gguf::Elem elem = elem_of(x, "gguf_matmul", "x");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.scalar_type() == x.scalar_type() && out.is_contiguous(),
              "gguf_matmul: out must be a contiguous [M=", x.size(0), ", N] tensor of x's dtype ", x.scalar_type(),
              "; got ", out.scalar_type(), " ", out.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  check_gguf_weight("gguf_matmul", weight, type, N, K);
  if (M == 0 || N == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (M >= kDenseFromM) {
    at::Tensor dense = at::empty({N, K}, x.options());
    check_launch(gguf::launch_gguf_dequantize(static_cast<int32_t>(type), weight.data_ptr<uint8_t>(), N, K,
                                              dense.data_ptr(), elem, stream),
                 "gguf_dequantize", type, M, N, K);
    at::mm_out(out, x, dense.t());
    return;
  }
  const at::Tensor xc = x.contiguous();
  check_launch(gguf::launch_gguf_matmul(static_cast<int32_t>(type), xc.data_ptr(), M, K, weight.data_ptr<uint8_t>(),
                                        out.data_ptr(), N, elem, stream),
               "gguf_matmul", type, M, N, K);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("gguf_matmul", &gguf_matmul_cuda);
  m.impl("gguf_dequantize", &gguf_dequantize_cuda);
}

}  // namespace specdec::ops
