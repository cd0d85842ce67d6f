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

// In channel order, one rounding per step, as the fast path's transposed loop adds them: a
// query's score does not depend on which path its tile took, i.e. on the other queries of the
// batch (a verification forward and one-token decoding give the same bits).
float dot(const float* x, const float* y, int64_t D) {
  float s = 0.f;
  for (int64_t d = 0; d < D; ++d) s += x[d] * y[d];
  return s;
}

// Nibbles of a packed row of D/2 bytes as D floats (channel 2c: low nibble of byte c).
void unpack_row(const uint8_t* packed, int64_t half, float* out) {
  for (int64_t c = 0; c < half; ++c) {
    out[2 * c] = static_cast<float>(packed[c] & 15u);
    out[2 * c + 1] = static_cast<float>(packed[c] >> 4);
  }
}

// x = upper * scale + zero (+ (lower - 8) * (scale / 16)), the reference's order of operations
// (kv::dequantize_one); scale * 0.0625f is scale / 16 exactly. Vectorises over channels.
void decode_row(const float* upper, const float* lower, const float* scale, const float* zero, int64_t D,
                bool use_lower, float* out) {
  if (use_lower) {
#pragma omp simd
    for (int64_t d = 0; d < D; ++d)
      out[d] = (upper[d] * scale[d] + zero[d]) + (lower[d] - 8.f) * (scale[d] * 0.0625f);
  } else {
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) out[d] = upper[d] * scale[d] + zero[d];
  }
}

// Per-tile scratch of the fast path (one source, every token visible).
struct Scratch {
  std::vector<float> upper, lower, scale, zero, rows, keys_t;
  explicit Scratch(int64_t D)
      : upper(D), lower(D), scale(D), zero(D), rows(kTile * D), keys_t(D * kTile) {}
};

// Keys of tokens t0 .. t0 + tt - 1 as rows [tt, D] (from the codes or the buffer).
void tile_keys(const Args& a, int64_t task, int64_t b, int64_t t0, int64_t tt, bool codes, Scratch& w) {
  const int64_t D = a.D, half = D / 2;
  for (int64_t u = 0; u < tt; ++u) {
    const int64_t t = t0 + u;
    float* row = w.rows.data() + u * D;
    if (!codes) {
      std::copy_n(a.k_buffer + (task * a.F + t - a.buffer_start[b]) * D, D, row);
      continue;
    }
    const int64_t byte = (task * a.capacity + t) * half;
    const int64_t param = (task * (a.capacity / a.key_group) + t / a.key_group) * D;
    unpack_row(a.k_upper + byte, half, w.upper.data());
    if (a.use_lower) unpack_row(a.k_lower + byte, half, w.lower.data());
    decode_row(w.upper.data(), w.lower.data(), a.k_scale + param, a.k_zero + param, D, a.use_lower, row);
  }
}

// Values of the tile as rows [tt, D]; a value group's scale / zero spread over its channels.
void tile_values(const Args& a, int64_t task, int64_t b, int64_t t0, int64_t tt, bool codes, Scratch& w,
                 float* out) {
  const int64_t D = a.D, half = D / 2, groups = D / a.value_group;
  for (int64_t u = 0; u < tt; ++u) {
    const int64_t t = t0 + u;
    float* row = out + u * D;
    if (!codes) {
      std::copy_n(a.v_buffer + (task * a.F + t - a.buffer_start[b]) * D, D, row);
      continue;
    }
    const int64_t byte = (task * a.capacity + t) * half;
    const float* sc = a.v_scale + (task * a.capacity + t) * groups;
    const float* ze = a.v_zero + (task * a.capacity + t) * groups;
    for (int64_t g = 0; g < groups; ++g) {  // no division per channel (it dominated the tile)
      std::fill_n(w.scale.data() + g * a.value_group, a.value_group, sc[g]);
      std::fill_n(w.zero.data() + g * a.value_group, a.value_group, ze[g]);
    }
    unpack_row(a.v_upper + byte, half, w.upper.data());
    if (a.use_lower) unpack_row(a.v_lower + byte, half, w.lower.data());
    decode_row(w.upper.data(), w.lower.data(), w.scale.data(), w.zero.data(), D, a.use_lower, row);
  }
}

}  // namespace

void quant_attention_cpu_tasks(const Args& a, int64_t task_begin, int64_t task_end) {
  const int64_t D = a.D, n = a.n, r = a.Hq / a.Hkv, R = r * n;
  std::vector<float> qf(R * D), acc(R * D), m(R), l(R), p(R * kTile);
  std::vector<float> kq(kTile * D), kf(kTile * D), vq(kTile * D), vf(kTile * D);
  std::vector<unsigned char> has_q(kTile), has_f(kTile);
  Scratch w(D);
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
      // Fast path: a tile of committed tokens that every query reads from one source (all from
      // the codes, or all from the buffer): no per-token mask or source test, keys transposed so
      // the scores of a query are one vectorised loop over the tile's tokens.
      const bool committed = t0 + tt <= a.lengths[b];
      const bool all_codes = t0 + tt <= qmin && t0 + tt <= a.capacity;
      const bool all_buffer = t0 >= qmax && t0 - start >= 0 && t0 + tt - start <= a.F;
      if (committed && (all_codes || all_buffer)) {
        tile_keys(a, task, b, t0, tt, all_codes, w);
        for (int64_t u = 0; u < kTile; ++u)
          for (int64_t d = 0; d < D; ++d) w.keys_t[d * kTile + u] = u < tt ? w.rows[u * D + d] : 0.f;
        for (int64_t rho = 0; rho < R; ++rho) {
          float* pr = p.data() + rho * kTile;
          const float* qr = qf.data() + rho * D;
          std::fill_n(pr, kTile, 0.f);
          for (int64_t d = 0; d < D; ++d) {
            const float qd = qr[d];
            const float* kd = w.keys_t.data() + d * kTile;
#pragma omp simd
            for (int64_t u = 0; u < kTile; ++u) pr[u] += qd * kd[u];
          }
          float block_max = neg_inf();
          for (int64_t u = 0; u < tt; ++u) block_max = std::max(block_max, pr[u]);
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
        tile_values(a, task, b, t0, tt, all_codes, w, w.rows.data());
        for (int64_t rho = 0; rho < R; ++rho) {
          const float* pr = p.data() + rho * kTile;
          float* ar = acc.data() + rho * D;
          for (int64_t u = 0; u < tt; ++u) {
            const float* v = w.rows.data() + u * D;
            const float wgt = pr[u];
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) ar[d] += wgt * v[d];
          }
        }
        continue;
      }
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
