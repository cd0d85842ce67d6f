// CPU glue of the `quant_attention` family: shape and value checks, then the (row, KV head) slabs
// split over torch's threads (kernel: csrc/kernels/quant_attention/quant_attention_cpu.cpp).
#include "ops/aten.h"
#include <torch/library.h>

#include <algorithm>

#include "kernels/quant_attention/quant_attention_cpu.h"
#include "ops/quant_attention_common.h"
#include "ops/quant_parallel.h"

namespace specdec::ops {
namespace {

// Every token a query can see must be readable: tokens below quant_len[b, i] from the codes
// (quant_len <= capacity), the others from the buffer (buffer_start <= quant_len and
// lengths + n - buffer_start <= F). The host holds these values here, so a bad one is an error
// naming the row rather than a token silently skipped.
void check_values(const qattn::Args& a) {
  for (int64_t b = 0; b < a.B; ++b) {
    const int64_t len = a.lengths[b], start = a.buffer_start[b];
    TORCH_CHECK(len >= 0 && start >= 0, "quant_kv_attention: row ", b, ": lengths (", len, ") and buffer_start (",
                start, ") must be >= 0");
    TORCH_CHECK(len + a.n - start <= a.F, "quant_kv_attention: row ", b, ": tokens up to ", len + a.n,
                " do not fit the buffer (", a.F, " slots from token ", start, ")");
    for (int64_t i = 0; i < a.n; ++i) {
      const int64_t ql = a.quant_len[b * a.n + i];
      TORCH_CHECK(ql >= start && ql <= a.capacity, "quant_kv_attention: quant_len[", b, ", ", i, "] = ", ql,
                  " must lie in [buffer_start = ", start, ", capacity = ", a.capacity, "]");
    }
  }
}

void quant_kv_attention_cpu(const at::Tensor& q, const at::Tensor& k_upper, const at::Tensor& k_lower,
                            const at::Tensor& k_scale, const at::Tensor& k_zero, const at::Tensor& v_upper,
                            const at::Tensor& v_lower, const at::Tensor& v_scale, const at::Tensor& v_zero,
                            const at::Tensor& k_buffer, const at::Tensor& v_buffer, const at::Tensor& quant_len,
                            const at::Tensor& buffer_start, const at::Tensor& lengths,
                            const std::optional<at::Tensor>& tree_mask, int64_t key_group, int64_t value_group,
                            bool use_lower, double sm_scale, at::Tensor& out) {
  const qattn::Args a = quant_attention_args(q, k_upper, k_lower, k_scale, k_zero, v_upper, v_lower, v_scale, v_zero,
                                             k_buffer, v_buffer, quant_len, buffer_start, lengths, tree_mask,
                                             key_group, value_group, use_lower, sm_scale, out);
  check_values(a);
  // One slab reads its whole context: worth a thread on its own.
  parallel_range(0, a.B * a.Hkv, 1, [&](int64_t begin, int64_t end) { qattn::quant_attention_cpu_tasks(a, begin, end); });
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("quant_kv_attention", &quant_kv_attention_cpu); }

}  // namespace specdec::ops
