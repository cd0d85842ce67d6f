// CUDA glue of `sample` and `verify_chain`: checks, packing, launch on the current stream.
// (c10/cuda headers only: ATen/cuda/CUDAContext.h pulls in cuSPARSE / cuBLAS headers that a bare
// CUDA toolkit may lack.)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include "kernels/sampling/sampling_cuda.h"
#include "ops/sampling_common.h"

namespace {

void check_launch(cudaError_t err, const char* op) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(err));
}

void check_cuda_dtype(const at::Tensor& logits, const char* name) {
  TORCH_CHECK(logits.scalar_type() != at::kDouble, name,
              " must be float32, float16 or bfloat16 on CUDA (float64 runs on the CPU only)");
}

void sample_cuda_op(const at::Tensor& logits, const at::Tensor& temperature,
                    const at::Tensor& top_k, const at::Tensor& top_p, const at::Tensor& seed,
                    const at::Tensor& position, int64_t purpose, int64_t substream,
                    const at::Tensor& tokens, const at::Tensor& status) {
  check_cuda_dtype(logits, "logits");
  const c10::cuda::CUDAGuard guard(logits.device());
  const auto a = specdec::sampling_glue::sample_args(logits, temperature, top_k, top_p, seed,
                                                     position, purpose, substream, tokens, status);
  TORCH_CHECK(a.rows < (int64_t{1} << 31), "sample: at most 2^31 - 1 rows on CUDA, got ", a.rows);
  check_launch(specdec::sampling::launch_sample(a, c10::cuda::getCurrentCUDAStream()), "sample");
}

// Serial walks whole rows with one block each: best when the rows alone fill the GPU and chains
// are often rejected early. Parallel spreads every (row, position) over its own block: best when
// the batch is small. The crossover is set by occupancy (132 SMs x 4 blocks of 256 threads on an
// H200): below ~2 blocks per SM from rows alone, parallel wins; bench/bench_sampling.py shows both.
bool use_parallel(const specdec::sampling::VerifyArgs& a, int64_t strategy) {
  if (strategy == 1) return true;
  if (strategy == 2) return false;
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return true;
  }
  return a.batch < 2 * static_cast<int64_t>(sms);
}

void verify_chain_cuda_op(const at::Tensor& draft_tokens, const at::Tensor& cu_num_draft,
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
  check_cuda_dtype(target_logits, "target_logits");
  const c10::cuda::CUDAGuard guard(target_logits.device());
  const auto a = specdec::sampling_glue::verify_args(
      draft_tokens, cu_num_draft, target_logits, draft_logits, temperature, top_k, top_p, seed,
      position, typical, typical_epsilon, typical_alpha, tokens, num_accepted, accepted, status);
  const int64_t targets = a.num_drafts + a.batch;
  TORCH_CHECK(targets < (int64_t{1} << 31), "verify_chain: at most 2^31 - 1 target rows on CUDA");
  const bool parallel = use_parallel(a, strategy);
  at::Tensor workspace;
  if (parallel) {
    const auto bytes = specdec::sampling::verify_chain_workspace_bytes(a.num_drafts, a.batch);
    workspace = at::empty({static_cast<int64_t>(bytes)}, target_logits.options().dtype(at::kByte));
  }
  check_launch(specdec::sampling::launch_verify_chain(
                   a, parallel, parallel ? workspace.data_ptr() : nullptr,
                   c10::cuda::getCurrentCUDAStream()),
               "verify_chain");
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("sample", &sample_cuda_op);
  m.impl("verify_chain", &verify_chain_cuda_op);
}
