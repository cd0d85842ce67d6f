// CUDA glue of the `quant_attention` family (kernel: csrc/kernels/quant_attention/quant_attention_cuda.cu).
// No value checks here (they would cost a device sync): the kernel skips any token it cannot read.
#include "ops/aten.h"
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels/quant_attention/quant_attention_cuda.h"
#include "ops/quant_attention_common.h"

namespace specdec::ops {
namespace {

void quant_kv_attention_cuda(const at::Tensor& q, const at::Tensor& k_upper, const at::Tensor& k_lower,
                             const at::Tensor& k_scale, const at::Tensor& k_zero, const at::Tensor& v_upper,
                             const at::Tensor& v_lower, const at::Tensor& v_scale, const at::Tensor& v_zero,
                             const at::Tensor& k_buffer, const at::Tensor& v_buffer, const at::Tensor& quant_len,
                             const at::Tensor& buffer_start, const at::Tensor& lengths,
                             const std::optional<at::Tensor>& tree_mask, int64_t key_group, int64_t value_group,
                             bool use_lower, double sm_scale, at::Tensor& out) {
  const qattn::Args a = quant_attention_args(q, k_upper, k_lower, k_scale, k_zero, v_upper, v_lower, v_scale, v_zero,
                                             k_buffer, v_buffer, quant_len, buffer_start, lengths, tree_mask,
                                             key_group, value_group, use_lower, sm_scale, out);
  for (const auto& [name, t] : {std::pair{"k_upper", &k_upper}, {"k_lower", &k_lower}, {"k_scale", &k_scale},
                                {"k_zero", &k_zero}, {"v_upper", &v_upper}, {"v_lower", &v_lower},
                                {"v_scale", &v_scale}, {"v_zero", &v_zero}, {"k_buffer", &k_buffer},
                                {"v_buffer", &v_buffer}, {"quant_len", &quant_len}, {"buffer_start", &buffer_start},
                                {"lengths", &lengths}, {"out", &out}})
    TORCH_CHECK(t->device() == q.device(), "quant_kv_attention: ", name, " must be on ", q.device(), "; got ",
                t->device());
  if (tree_mask.has_value())
    TORCH_CHECK(tree_mask->device() == q.device(), "quant_kv_attention: tree_mask must be on ", q.device());
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = qattn::launch_quant_attention(a, c10::cuda::getCurrentCUDAStream());
  TORCH_CHECK(err == cudaSuccess, "quant_kv_attention failed for q ", q.sizes(), " over ", a.Hkv,
              " KV heads: ", cudaGetErrorString(err));
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) { m.impl("quant_kv_attention", &quant_kv_attention_cuda); }

}  // namespace specdec::ops
