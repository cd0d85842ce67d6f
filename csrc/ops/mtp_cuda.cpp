// CUDA glue of the `mtp` family: fused MTP-head output side (norm + LM head + top-k) and input
// side (embedding gather + two norms + split eh_proj). Kernels: csrc/kernels/mtp/mtp_cuda.h.
#include "ops/aten.h"
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels/common/dtype.h"
#include "kernels/mtp/mtp_cuda.h"
#include "ops/mtp_common.h"

namespace specdec::ops {
namespace {

int kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return static_cast<int>(DType::kFloat32);
    case at::kHalf: return static_cast<int>(DType::kFloat16);
    case at::kBFloat16: return static_cast<int>(DType::kBFloat16);
    default: return static_cast<int>(DType::kFloat64);
  }
}

void mtp_head_topk_cuda(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& lm_head, double eps,
                        at::Tensor& values, at::Tensor& indices, std::optional<at::Tensor> logits,
                        at::Tensor& status) {
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  const int64_t k = check_head_topk(x, norm_weight, lm_head, values, indices, logits, status);
  const int64_t M = x.size(0), H = x.size(1), V = lm_head.size(0);
  if (M == 0) return;
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t parts = (V + mtp::kVocabTile - 1) / mtp::kVocabTile;
  // Workspaces: normalised rows [M, H] and the tiles' top-k lists [parts, M, k].
  at::Tensor xn = at::empty({M, H}, values.options());
  at::Tensor part_vals = at::empty({parts, M, k}, values.options());
  at::Tensor part_idx = at::empty({parts, M, k}, indices.options());
  at::Tensor part_bad = at::empty({parts, M}, values.options().dtype(at::kByte));
  const cudaError_t err = mtp::launch_head_topk(
      kernel_dtype(x.scalar_type()), x.data_ptr(), norm_weight.data_ptr(), lm_head.data_ptr(), eps, M, H, V,
      static_cast<int>(k), xn.data_ptr(), part_vals.data_ptr(), part_idx.data_ptr<int64_t>(),
      part_bad.data_ptr<uint8_t>(), values.data_ptr(), indices.data_ptr<int64_t>(),
      logits ? logits->data_ptr() : nullptr, status.data_ptr<int32_t>(), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "mtp_head_topk launch failed for x [", M, ", ", H, "], lm_head [", V, ", ", H,
              "], k=", k, ": ", cudaGetErrorString(err));
}

void mtp_input_cuda(const at::Tensor& h, const at::Tensor& tokens, const at::Tensor& embed,
                    const at::Tensor& enorm_weight, const at::Tensor& hnorm_weight, const at::Tensor& eh_proj,
                    double eps, at::Tensor& out, at::Tensor& status) {
  TORCH_CHECK(h.is_cuda(), "h must be a CUDA tensor");
  check_mtp_input(h, tokens, embed, enorm_weight, hnorm_weight, eh_proj, out, status);
  const int64_t M = h.size(0), H = h.size(1);
  if (M == 0) return;
  const c10::cuda::CUDAGuard guard(h.device());
  at::Tensor en = at::empty({M, H}, out.options()), hn = at::empty({M, H}, out.options());
  const cudaError_t err = mtp::launch_mtp_input(
      kernel_dtype(h.scalar_type()), h.data_ptr(), tokens.data_ptr<int64_t>(), embed.data_ptr(), embed.size(0),
      enorm_weight.data_ptr(), hnorm_weight.data_ptr(), eh_proj.data_ptr(), eps, M, H, en.data_ptr(), hn.data_ptr(),
      out.data_ptr(), status.data_ptr<int32_t>(), c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "mtp_input launch failed for h [", M, ", ", H, "]: ", cudaGetErrorString(err));
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("mtp_head_topk", &mtp_head_topk_cuda);
  m.impl("mtp_input", &mtp_input_cuda);
}

}  // namespace specdec::ops
