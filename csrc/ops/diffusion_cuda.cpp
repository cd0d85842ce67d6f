// CUDA glue of `diffusion_unmask`: checks, packing, launch on the current stream (no host sync:
// the step substreams are masked into range by the Python layer, which checks them on the host).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include "kernels/diffusion/diffusion_cuda.h"
#include "ops/diffusion_common.h"

namespace {

void diffusion_unmask_cuda_op(const at::Tensor& logits, const at::Tensor& tokens, int64_t mask_id,
                              const at::Tensor& temperature, const at::Tensor& top_k,
                              const at::Tensor& top_p, const at::Tensor& seed,
                              const at::Tensor& position, const at::Tensor& step,
                              const at::Tensor& num_transfer, const at::Tensor& threshold,
                              const at::Tensor& sampled, const at::Tensor& confidence,
                              const at::Tensor& keep, const at::Tensor& status) {
  TORCH_CHECK(logits.scalar_type() != at::kDouble,
              "logits must be float32, float16 or bfloat16 on CUDA (float64 runs on the CPU only)");
  const c10::cuda::CUDAGuard guard(logits.device());
  // position_status: (batch, width) int32, step 1's per-position statuses
  const at::Tensor position_status =
      at::empty({tokens.size(0), tokens.size(1)}, tokens.options().dtype(at::kInt));
  const auto a = specdec::diffusion_glue::unmask_args(
      logits, tokens, mask_id, temperature, top_k, top_p, seed, position, step, num_transfer,
      threshold, sampled, confidence, keep, status, position_status);
  TORCH_CHECK(a.batch * a.width < (int64_t{1} << 31),
              "diffusion_unmask: at most 2^31 - 1 positions on CUDA, got ", a.batch * a.width);
  const cudaError_t err =
      specdec::diffusion::launch_unmask(a, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "diffusion_unmask: CUDA launch failed: ", cudaGetErrorString(err));
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) { m.impl("diffusion_unmask", &diffusion_unmask_cuda_op); }
