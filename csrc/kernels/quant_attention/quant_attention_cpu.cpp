// Attention over the hierarchical 4-bit KV cache on the CPU (see quant_attention.h).
//
// Per (row b, KV head h) slab, the R = (Hq / Hkv) * n queries that share the KV head are one
// block: the tokens 0 .. lengths[b] + n - 1 go by in tiles of kTile; each tile's keys are decoded
// once (from the codes, and / or copied from the buffer where some query reads them in full
// precision), scored against all R queries, folded into a running softmax (max m, sum l), then the
// tile's values are decoded once and accumulated. Nothing of the size of the context is written.
#include "kernels/quant_attention/quant_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace specdec::qattn {
namespace {

// Tokens per tile: half a key group at the default 64; the decoded K and V tiles (2 * 32 * D
// floats, 32 KiB at D = 128) stay in L1 / L2 while R queries read them.
constexpr int64_t kTile = 32;

float dot(const float* x, const float* y, int64_t D) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t d = 0; d < D; ++d) s += x[d] * y[d];
  return s;
}

}  // namespace

void quant_attention_cpu_tasks(const Args& a, int64_t task_begin, int64_t task_end) {
  const int64_t D = a.D, n = a.n, r = a.Hq / a.Hkv, R = r * n;
  std::vector<float> qf(R * D), acc(R * D), m(R), l(R), p(R * kTile);
  std::vector<float> kq(kTile * D), kf(kTile * D), vq(kTile * D), vf(kTile * D);
  std::vector<unsigned char> has_q(kTile), has_f(kTile);
  for (int64_t task = task_begin; task < task_end; ++task) {
    const int64_t b = task / a.Hkv, h = task % a.Hkv;
    // Query heads h*r .. h*r + r - 1 are adjacent in [B, Hq, n, D]: one [R, D] block, row rho =
    // head offset * n + new-token index.
    const float* q = a.q + (b * a.Hq + h * r) * n * D;
    float* out = a.out + (b * a.Hq + h * r) * n * D;
    for (int64_t x = 0; x < R * D; ++x) qf[x] = q[x] * a.sm_scale;
    std::fill(acc.begin(), acc.end(), 0.f);
    std::fill(m.begin(), m.end(), neg_inf());
    std::fill(l.begin(), l.end(), 0.f);
    const int64_t* qlen = a.quant_len + b * n;  // [n]
    const int64_t qmin = *std::min_element(qlen, qlen + n), qmax = *std::max_element(qlen, qlen + n);
    const int64_t total = a.lengths[b] + n, start = a.buffer_start[b];
    for (int64_t t0 = 0; t0 < total; t0 += kTile) {
      const int64_t tt = std::min(kTile, total - t0);
      for (int64_t u = 0; u < tt; ++u) {  // decode each key once: the versions some query reads
        const int64_t t = t0 + u;
        has_q[u] = t < qmax && in_quant(a, t);
        has_f[u] = t >= qmin && in_buffer(a, b, t);
        if (has_q[u]) quant_key_row(a, task, t, kq.data() + u * D);
        if (has_f[u]) std::copy_n(a.k_buffer + (task * a.F + t - start) * D, D, kf.data() + u * D);
      }
      for (int64_t rho = 0; rho < R; ++rho) {
        const int64_t i = rho % n;
        float* pr = p.data() + rho * kTile;
        if (t0 > last_seen(a, b, i)) {  // the whole tile lies after what query i sees (prefill)
          std::fill_n(pr, tt, 0.f);
          continue;
        }
        float block_max = neg_inf();
        for (int64_t u = 0; u < tt; ++u) {
          const int64_t t = t0 + u;
          const bool quant = t < qlen[i];
          float s = neg_inf();
          if (visible(a, b, i, t) && (quant ? has_q[u] : has_f[u]))
            s = dot(qf.data() + rho * D, (quant ? kq : kf).data() + u * D, D);
          pr[u] = s;
          block_max = std::max(block_max, s);
        }
        const float alpha = online_rescale(m[rho], block_max);
        if (alpha != 1.f) {
          l[rho] *= alpha;
          for (int64_t d = 0; d < D; ++d) acc[rho * D + d] *= alpha;
        }
        for (int64_t u = 0; u < tt; ++u) {
          pr[u] = exp_shifted(pr[u], m[rho]);
          l[rho] += pr[u];
        }
      }
      for (int64_t u = 0; u < tt; ++u) {  // values, once per tile
        const int64_t t = t0 + u;
        if (has_q[u]) quant_value_row(a, task, t, vq.data() + u * D);
        if (has_f[u]) std::copy_n(a.v_buffer + (task * a.F + t - start) * D, D, vf.data() + u * D);
      }
      for (int64_t rho = 0; rho < R; ++rho) {
        const int64_t i = rho % n;
        const float* pr = p.data() + rho * kTile;
        float* ar = acc.data() + rho * D;
        if (t0 > last_seen(a, b, i)) continue;
        for (int64_t u = 0; u < tt; ++u) {
          if (pr[u] == 0.f) continue;  // masked (or underflowed): nothing to add
          const float* v = ((t0 + u) < qlen[i] ? vq : vf).data() + u * D;
          const float w = pr[u];
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) ar[d] += w * v[d];
        }
      }
    }
    for (int64_t rho = 0; rho < R; ++rho) {
      // Every query sees at least itself, so l > 0 unless its scores were NaN (then NaN out).
      const float inv = 1.f / l[rho];
      for (int64_t d = 0; d < D; ++d) out[rho * D + d] = acc[rho * D + d] * inv;
    }
  }
}

}  // namespace specdec::qattn
