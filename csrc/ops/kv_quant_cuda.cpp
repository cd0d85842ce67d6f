// CUDA glue of the `kv_quant` family (kernels: csrc/kernels/kv_quant/hier4_cuda.cu).
#include "ops/aten.h"
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "kernels/kv_quant/hier4_cuda.h"
#include "ops/kv_quant_common.h"

namespace specdec::ops {
namespace {

DType kernel_dtype(const at::Tensor& x) {
  switch (x.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    default: return DType::kBFloat16;
  }
}

void check_on_cuda(std::initializer_list<std::pair<const char*, const at::Tensor*>> tensors) {
  const at::Device device = tensors.begin()->second->device();
  for (const auto& [name, t] : tensors)
    TORCH_CHECK(t->is_cuda() && t->device() == device, name, " must be on ", device, "; got ", t->device());
}

void check_status(cudaError_t err, const char* what, const KvShape& s) {
  TORCH_CHECK(err == cudaSuccess, what, " failed for [", s.B, ", ", s.H, ", ", s.T, ", ", s.D, "] (capacity ",
              s.capacity, "): ", cudaGetErrorString(err));
}

void kv_quantize_keys_cuda(const at::Tensor& k, const at::Tensor& start, int64_t group_size, at::Tensor& k_upper,
                           at::Tensor& k_lower, at::Tensor& k_scale, at::Tensor& k_zero) {
  check_activation(k, "k");
  const KvShape s = check_keys(k, k_upper, k_lower, k_scale, k_zero, group_size, /*block=*/true);
  check_start(start, s.B);
  check_on_cuda({{"k", &k}, {"start", &start}, {"k_upper", &k_upper}, {"k_lower", &k_lower}, {"k_scale", &k_scale},
                 {"k_zero", &k_zero}});
  const c10::cuda::CUDAGuard guard(k.device());
  check_status(kv::launch_quantize_keys(k.data_ptr(), kernel_dtype(k), start.data_ptr<int64_t>(), s.B, s.H, s.T, s.D,
                                        s.capacity, group_size, k_upper.data_ptr<uint8_t>(),
                                        k_lower.data_ptr<uint8_t>(), k_scale.data_ptr<float>(),
                                        k_zero.data_ptr<float>(), c10::cuda::getCurrentCUDAStream()),
               "kv_quantize_keys", s);
}

void kv_quantize_values_cuda(const at::Tensor& v, const at::Tensor& start, int64_t group_size, at::Tensor& v_upper,
                             at::Tensor& v_lower, at::Tensor& v_scale, at::Tensor& v_zero) {
  check_activation(v, "v");
  const KvShape s = check_values(v, v_upper, v_lower, v_scale, v_zero, group_size, /*block=*/true);
  check_start(start, s.B);
  check_on_cuda({{"v", &v}, {"start", &start}, {"v_upper", &v_upper}, {"v_lower", &v_lower}, {"v_scale", &v_scale},
                 {"v_zero", &v_zero}});
  const c10::cuda::CUDAGuard guard(v.device());
  check_status(kv::launch_quantize_values(v.data_ptr(), kernel_dtype(v), start.data_ptr<int64_t>(), s.B, s.H, s.T,
                                          s.D, s.capacity, group_size, v_upper.data_ptr<uint8_t>(),
                                          v_lower.data_ptr<uint8_t>(), v_scale.data_ptr<float>(),
                                          v_zero.data_ptr<float>(), c10::cuda::getCurrentCUDAStream()),
               "kv_quantize_values", s);
}

void dequantize_cuda(bool keys, const at::Tensor& upper, const at::Tensor& lower, const at::Tensor& scale,
                     const at::Tensor& zero, int64_t group_size, bool use_lower, at::Tensor& out, const KvShape& s) {
  check_on_cuda({{"out", &out}, {"upper", &upper}, {"lower", &lower}, {"scale", &scale}, {"zero", &zero}});
  const c10::cuda::CUDAGuard guard(out.device());
  // The kernel stores pairs of outputs as one word: write to a temporary unless `out` is aligned.
  const bool direct = reinterpret_cast<uintptr_t>(out.data_ptr()) % (2 * out.element_size()) == 0;
  at::Tensor outf = direct ? out : at::empty(out.sizes(), out.options());
  check_status(kv::launch_dequantize(keys, upper.data_ptr<uint8_t>(), lower.data_ptr<uint8_t>(), scale.data_ptr<float>(),
                                     zero.data_ptr<float>(), s.B, s.H, s.T, s.D, s.capacity, group_size, use_lower,
                                     outf.data_ptr(), kernel_dtype(outf), c10::cuda::getCurrentCUDAStream()),
               keys ? "kv_dequantize_keys" : "kv_dequantize_values", s);
  if (!outf.is_same(out)) out.copy_(outf);
}

void kv_dequantize_keys_cuda(const at::Tensor& k_upper, const at::Tensor& k_lower, const at::Tensor& k_scale,
                             const at::Tensor& k_zero, int64_t group_size, bool use_lower, at::Tensor& out) {
  check_activation(out, "out");
  const KvShape s = check_keys(out, k_upper, k_lower, k_scale, k_zero, group_size, /*block=*/false);
  dequantize_cuda(true, k_upper, k_lower, k_scale, k_zero, group_size, use_lower, out, s);
}

void kv_dequantize_values_cuda(const at::Tensor& v_upper, const at::Tensor& v_lower, const at::Tensor& v_scale,
                               const at::Tensor& v_zero, int64_t group_size, bool use_lower, at::Tensor& out) {
  check_activation(out, "out");
  const KvShape s = check_values(out, v_upper, v_lower, v_scale, v_zero, group_size, /*block=*/false);
  dequantize_cuda(false, v_upper, v_lower, v_scale, v_zero, group_size, use_lower, out, s);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CUDA, m) {
  m.impl("kv_quantize_keys", &kv_quantize_keys_cuda);
  m.impl("kv_quantize_values", &kv_quantize_values_cuda);
  m.impl("kv_dequantize_keys", &kv_dequantize_keys_cuda);
  m.impl("kv_dequantize_values", &kv_dequantize_values_cuda);
}

}  // namespace specdec::ops
