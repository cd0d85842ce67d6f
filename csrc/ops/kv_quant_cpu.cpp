// CPU glue of the `kv_quant` family: loops over (row, head, group) calling the per-group code in
// csrc/kernels/kv_quant/hier4.h, the same code the CUDA kernels run per thread.
#include "ops/aten.h"
#include <torch/library.h>

#include <algorithm>
#include <utility>

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

// T <= cap was checked with the shapes; comparing with cap - T (not start + T, which overflows
// for a start near INT64_MAX and would pass) keeps every block inside the cache.
void check_cpu_start(const at::Tensor& start, int64_t T, int64_t cap, int64_t G) {
  const int64_t* s = start.data_ptr<int64_t>();
  for (int64_t b = 0; b < start.size(0); ++b)
    TORCH_CHECK(s[b] >= 0 && s[b] % G == 0 && s[b] <= cap - T, "start[", b, "] = ", s[b],
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

// Shared read-back loop. For token t of slab r, `params(r, t)` returns the scale / zero offset of
// channel pair 0 and `pair_param(i)` the offsets of pair i's two channels relative to it, so the
// inner loop over channel pairs is index arithmetic the compiler can hoist.
template <typename Params, typename PairParam>
void dequantize_cpu(const at::Tensor& upper, const at::Tensor& lower, const at::Tensor& scale,
                    const at::Tensor& zero, bool use_lower, at::Tensor& out, const KvShape& s,
                    const Params& params, const PairParam& pair_param) {
  at::Tensor outf = out.scalar_type() == at::kFloat ? out : at::empty(out.sizes(), out.options().dtype(at::kFloat));
  const uint8_t* up = upper.data_ptr<uint8_t>();
  const uint8_t* lo = lower.data_ptr<uint8_t>();
  const float* sc = scale.data_ptr<float>();
  const float* ze = zero.data_ptr<float>();
  float* o = outf.data_ptr<float>();
  const int64_t half = s.D / 2;
  parallel_range(0, s.B * s.H, grain_rows(s.T, s.D), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t t = 0; t < s.T; ++t) {
        const int64_t byte0 = (r * s.capacity + t) * half;
        const float* st = sc + params(r, t);
        const float* zt = ze + params(r, t);
        float* ot = o + (r * s.T + t) * s.D;
        if (use_lower) {
          for (int64_t i = 0; i < half; ++i) {
            const auto [a, b] = pair_param(i);
            kv::dequantize_byte(up[byte0 + i], lo[byte0 + i], st[a], zt[a], st[b], zt[b], true, ot + 2 * i);
          }
        } else {  // upper only: the lower codes are not read
          for (int64_t i = 0; i < half; ++i) {
            const auto [a, b] = pair_param(i);
            kv::dequantize_byte(up[byte0 + i], 0x88, st[a], zt[a], st[b], zt[b], false, ot + 2 * i);
          }
        }
      }
  });
  if (!outf.is_same(out)) out.copy_(outf);
}

void kv_dequantize_keys_cpu(const at::Tensor& k_upper, const at::Tensor& k_lower, const at::Tensor& k_scale,
                            const at::Tensor& k_zero, int64_t group_size, bool use_lower, at::Tensor& out) {
  check_activation(out, "out");
  const KvShape s = check_keys(out, k_upper, k_lower, k_scale, k_zero, group_size, /*block=*/false);
  const int64_t G = group_size, D = s.D, per_row = (s.capacity / G) * D;
  // k_scale: (B, H, capacity/G, D): one entry per channel of the token's group
  dequantize_cpu(k_upper, k_lower, k_scale, k_zero, use_lower, out, s,
                 [=](int64_t r, int64_t t) { return r * per_row + (t / G) * D; },
                 [](int64_t i) { return std::pair<int64_t, int64_t>{2 * i, 2 * i + 1}; });
}

void kv_dequantize_values_cpu(const at::Tensor& v_upper, const at::Tensor& v_lower, const at::Tensor& v_scale,
                              const at::Tensor& v_zero, int64_t group_size, bool use_lower, at::Tensor& out) {
  check_activation(out, "out");
  const KvShape s = check_values(out, v_upper, v_lower, v_scale, v_zero, group_size, /*block=*/false);
  const int64_t G = group_size, groups = s.D / G, cap = s.capacity;
  // v_scale: (B, H, capacity, D/G): both channels of a pair share a group (G is even)
  dequantize_cpu(v_upper, v_lower, v_scale, v_zero, use_lower, out, s,
                 [=](int64_t r, int64_t t) { return (r * cap + t) * groups; },
                 [=](int64_t i) { return std::pair<int64_t, int64_t>{2 * i / G, 2 * i / G}; });
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("kv_quantize_keys", &kv_quantize_keys_cpu);
  m.impl("kv_quantize_values", &kv_quantize_values_cpu);
  m.impl("kv_dequantize_keys", &kv_dequantize_keys_cpu);
  m.impl("kv_dequantize_values", &kv_dequantize_values_cpu);
}

}  // namespace specdec::ops
