// CPU glue of the `kv_quant` family: loops over (row, head, group) calling the per-group code in
// csrc/kernels/kv_quant/hier4.h, the same code the CUDA kernels run per thread.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>

#include "kernels/kv_quant/hier4.h"
#include "ops/kv_quant_common.h"
#include "ops/quant_parallel.h"

namespace specdec::ops {
namespace {

// (row, head) slabs per thread chunk: at least ~64K elements each, worth a thread start.
int64_t grain_rows(int64_t tokens, int64_t D) { return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, tokens * D)); }

template <typename F>
void dispatch_input(const at::Tensor& x, const F& f) {
  switch (x.scalar_type()) {
    case at::kFloat: f(x.data_ptr<float>()); break;
    case at::kHalf: f(reinterpret_cast<const Half16*>(x.data_ptr<at::Half>())); break;
    default: f(reinterpret_cast<const BFloat16*>(x.data_ptr<at::BFloat16>())); break;
  }
}

void check_cpu_start(const at::Tensor& start, int64_t T, int64_t cap, int64_t G) {
  const int64_t* s = start.data_ptr<int64_t>();
  for (int64_t b = 0; b < start.size(0); ++b)
    TORCH_CHECK(s[b] >= 0 && s[b] % G == 0 && s[b] + T <= cap, "start[", b, "] = ", s[b],
                " must be a multiple of ", G, " with start + ", T, " tokens <= capacity ", cap);
}

void kv_quantize_keys_cpu(const at::Tensor& k, const at::Tensor& start, int64_t group_size,
                          at::Tensor& k_upper, at::Tensor& k_lower, at::Tensor& k_scale, at::Tensor& k_zero) {
  check_activation(k, "k");
  const KvShape s = check_keys(k, k_upper, k_lower, k_scale, k_zero, group_size, /*block=*/true);
  check_start(start, s.B);
  check_cpu_start(start, s.T, s.capacity, group_size);
  const int64_t G = group_size, groups = s.T / G, rows = s.B * s.H;
  const int64_t* st = start.data_ptr<int64_t>();
  dispatch_input(k, [&](auto* kp) {
    parallel_range(0, rows, grain_rows(s.T, s.D), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t t0 = st[r / s.H];
        for (int64_t g = 0; g < groups; ++g)
          for (int64_t d = 0; d < s.D; d += 2) {
            const int64_t tok = t0 + g * G;  // first cache token of this group
            kv::quantize_key_pair(kp + (r * s.T + g * G) * s.D + d, s.D, G,
                                  k_upper.data_ptr<uint8_t>() + (r * s.capacity + tok) * (s.D / 2) + d / 2,
                                  k_lower.data_ptr<uint8_t>() + (r * s.capacity + tok) * (s.D / 2) + d / 2,
                                  k_scale.data_ptr<float>() + (r * (s.capacity / G) + tok / G) * s.D + d,
                                  k_zero.data_ptr<float>() + (r * (s.capacity / G) + tok / G) * s.D + d);
          }
      }
    });
  });
}

void kv_quantize_values_cpu(const at::Tensor& v, const at::Tensor& start, int64_t group_size,
                            at::Tensor& v_upper, at::Tensor& v_lower, at::Tensor& v_scale, at::Tensor& v_zero) {
  check_activation(v, "v");
  const KvShape s = check_values(v, v_upper, v_lower, v_scale, v_zero, group_size, /*block=*/true);
  check_start(start, s.B);
  check_cpu_start(start, s.T, s.capacity, 1);
  const int64_t G = group_size, groups = s.D / G, rows = s.B * s.H;
  const int64_t* st = start.data_ptr<int64_t>();
  dispatch_input(v, [&](auto* vp) {
    parallel_range(0, rows, grain_rows(s.T, s.D), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t t = 0; t < s.T; ++t) {
          const int64_t tok = r * s.capacity + st[r / s.H] + t;  // flat cache token
          for (int64_t g = 0; g < groups; ++g)
            kv::quantize_value_group(vp + (r * s.T + t) * s.D + g * G, G,
                                     v_upper.data_ptr<uint8_t>() + tok * (s.D / 2) + g * G / 2,
                                     v_lower.data_ptr<uint8_t>() + tok * (s.D / 2) + g * G / 2,
                                     v_scale.data_ptr<float>() + tok * groups + g,
                                     v_zero.data_ptr<float>() + tok * groups + g);
        }
    });
  });
}

// Shared read-back loop; `param_index(token, channel)` gives the flat scale / zero index within a
// (row, head) slab.
template <typename ParamIndex>
void dequantize_cpu(const at::Tensor& upper, const at::Tensor& lower, const at::Tensor& scale,
                    const at::Tensor& zero, bool use_lower, at::Tensor& out, const KvShape& s,
                    int64_t params_per_row, const ParamIndex& param_index) {
  at::Tensor outf = out.scalar_type() == at::kFloat ? out : at::empty(out.sizes(), out.options().dtype(at::kFloat));
  const uint8_t* up = upper.data_ptr<uint8_t>();
  const uint8_t* lo = lower.data_ptr<uint8_t>();
  const float* sc = scale.data_ptr<float>();
  const float* ze = zero.data_ptr<float>();
  float* o = outf.data_ptr<float>();
  parallel_range(0, s.B * s.H, grain_rows(s.T, s.D), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t byte0 = (r * s.capacity + t) * (s.D / 2);
        for (int64_t i = 0; i < s.D / 2; ++i) {
          const int64_t p0 = r * params_per_row + param_index(t, 2 * i);
          const int64_t p1 = r * params_per_row + param_index(t, 2 * i + 1);
          kv::dequantize_byte(up[byte0 + i], use_lower ? lo[byte0 + i] : uint8_t{0x88}, sc[p0], ze[p0], sc[p1],
                              ze[p1], use_lower, o + (r * s.T + t) * s.D + 2 * i);
        }
      }
  });
  if (!outf.is_same(out)) out.copy_(outf);
}

void kv_dequantize_keys_cpu(const at::Tensor& k_upper, const at::Tensor& k_lower, const at::Tensor& k_scale,
                            const at::Tensor& k_zero, int64_t group_size, bool use_lower, at::Tensor& out) {
  check_activation(out, "out");
  const KvShape s = check_keys(out, k_upper, k_lower, k_scale, k_zero, group_size, /*block=*/false);
  const int64_t G = group_size, D = s.D;
  dequantize_cpu(k_upper, k_lower, k_scale, k_zero, use_lower, out, s, (s.capacity / G) * D,
                 [G, D](int64_t t, int64_t d) { return (t / G) * D + d; });
}

void kv_dequantize_values_cpu(const at::Tensor& v_upper, const at::Tensor& v_lower, const at::Tensor& v_scale,
                              const at::Tensor& v_zero, int64_t group_size, bool use_lower, at::Tensor& out) {
  check_activation(out, "out");
  const KvShape s = check_values(out, v_upper, v_lower, v_scale, v_zero, group_size, /*block=*/false);
  const int64_t G = group_size, groups = s.D / G;
  dequantize_cpu(v_upper, v_lower, v_scale, v_zero, use_lower, out, s, s.capacity * groups,
                 [G, groups](int64_t t, int64_t d) { return t * groups + d / G; });
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("kv_quantize_keys", &kv_quantize_keys_cpu);
  m.impl("kv_quantize_values", &kv_quantize_values_cpu);
  m.impl("kv_dequantize_keys", &kv_dequantize_keys_cpu);
  m.impl("kv_dequantize_values", &kv_dequantize_values_cpu);
}

}  // namespace specdec::ops
