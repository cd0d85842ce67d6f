// Attention over the hierarchical 4-bit KV cache on the CPU (see quant_attention.h): the portable
// kernel (any x86-64 / other CPU; quant_attention_avx512.cpp is the AVX-512 one) and the dispatch.
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

#include "kernels/common/cpu_isa.h"

namespace specdec::qattn {
namespace {

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

// Rows [count, D] of tokens t0 .. t0 + count - 1: keys (values = false) or values, decoded from
// the codes (codes = true) or copied from the buffer.
void decode_rows(const Args& a, int64_t task, int64_t b, int64_t t0, int64_t count, bool values, bool codes,
                 std::vector<float>& scratch, float* out) {
  const int64_t D = a.D, half = D / 2, vgroups = D / a.value_group;
  float* upper = scratch.data();
  float* lower = upper + D;
  float* scale = lower + D;
  float* zero = scale + D;
  const float* buffer = values ? a.v_buffer : a.k_buffer;
  for (int64_t u = 0; u < count; ++u) {
    const int64_t t = t0 + u;
    float* row = out + u * D;
    if (!codes) {
      std::copy_n(buffer + (task * a.F + t - a.buffer_start[b]) * D, D, row);
      continue;
    }
    const int64_t byte = (task * a.capacity + t) * half;
    const float* sc;
    const float* ze;
    if (values) {  // one scale / zero per value group of the token, spread over its channels
      const int64_t param = (task * a.capacity + t) * vgroups;
      for (int64_t g = 0; g < vgroups; ++g) {  // no division per channel (it dominated the tile)
        std::fill_n(scale + g * a.value_group, a.value_group, a.v_scale[param + g]);
        std::fill_n(zero + g * a.value_group, a.value_group, a.v_zero[param + g]);
      }
      sc = scale, ze = zero;
    } else {  // keys: one scale / zero per channel of the token's group
      const int64_t param = (task * (a.capacity / a.key_group) + t / a.key_group) * D;
      sc = a.k_scale + param, ze = a.k_zero + param;
    }
    unpack_row((values ? a.v_upper : a.k_upper) + byte, half, upper);
    if (a.use_lower) unpack_row((values ? a.v_lower : a.k_lower) + byte, half, lower);
    decode_row(upper, lower, sc, ze, D, a.use_lower, row);
  }
}

// acc[d] += p[u] * rows[u][d] for u in [begin, end) (masked tokens have p = 0 and add nothing).
void accumulate(const float* p, int64_t begin, int64_t end, const float* rows, int64_t D, float* acc) {
  for (int64_t u = begin; u < end; ++u) {
    const float w = p[u];
    if (w == 0.f) continue;
    const float* v = rows + u * D;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[d] += w * v[d];
  }
}

// rows [tt, D] -> transposed [D, kTile] (columns past tt zero).
void transpose_tile(const float* rows, int64_t tt, int64_t D, float* out) {
  for (int64_t d = 0; d < D; ++d)
    for (int64_t u = 0; u < kTile; ++u) out[d * kTile + u] = u < tt ? rows[u * D + d] : 0.f;
}

}  // namespace

void quant_attention_portable_tasks(const Args& a, int64_t task_begin, int64_t task_end) {
  const int64_t D = a.D, n = a.n, r = a.Hq / a.Hkv, R = r * n;
  std::vector<float> qf(R * D), acc(R * D), m(R), l(R), p(R * kTile), scratch(4 * D);
  // Decoded tile, per source: rows [kTile, D] of keys and values, keys transposed [D, kTile].
  std::vector<float> kq(kTile * D), kf(kTile * D), vq(kTile * D), vf(kTile * D), kqt(D * kTile), kft(D * kTile);
  for (int64_t task = task_begin; task < task_end; ++task) {
    const Slab slab = begin_slab(a, task, qf.data(), acc.data(), m.data(), l.data());
    const int64_t b = slab.b;
    const int64_t* qlen = slab.qlen;
    float* out = slab.out;
    for (int64_t t0 = 0; t0 < slab.total; t0 += kTile) {
      const int64_t tt = std::min(kTile, slab.total - t0);
      // Codes [t0, q_end), buffer [f_begin, f_end): what some query reads from each source.
      const auto [q_end, f_begin, f_end] = tile_ranges(a, slab, t0, tt);
      const bool whole_q = q_end == t0 + tt, whole_f = f_begin == t0 && f_end == t0 + tt;
      decode_rows(a, task, b, t0, q_end - t0, false, true, scratch, kq.data());
      decode_rows(a, task, b, f_begin, f_end - f_begin, false, false, scratch, kf.data() + (f_begin - t0) * D);
      if (whole_q) transpose_tile(kq.data(), tt, D, kqt.data());
      if (whole_f) transpose_tile(kf.data(), tt, D, kft.data());
      for (int64_t rho = 0; rho < R; ++rho) {
        const int64_t i = rho % n, last = last_seen(a, b, i);
        float* pr = p.data() + rho * kTile;
        if (t0 > last) {  // the whole tile lies after what query i sees (prefill)
          std::fill_n(pr, tt, 0.f);
          continue;
        }
        const float* qr = qf.data() + rho * D;
        // Fast path: query i sees every token of the tile and reads all of it from one source:
        // scores as one vectorised loop over the tile's tokens, in the channel order of `dot`.
        const bool sees_all = t0 + tt - 1 <= last && (a.tree_mask == nullptr || t0 + tt <= a.lengths[b]);
        const float* kt = !sees_all ? nullptr
                          : (t0 + tt <= qlen[i] && whole_q) ? kqt.data()
                          : (t0 >= qlen[i] && whole_f)      ? kft.data()
                                                            : nullptr;
        float block_max = neg_inf();
        if (kt != nullptr) {
          std::fill_n(pr, kTile, 0.f);
          for (int64_t d = 0; d < D; ++d) {
            const float qd = qr[d];
            const float* kd = kt + d * kTile;
#pragma omp simd
            for (int64_t u = 0; u < kTile; ++u) pr[u] += qd * kd[u];
          }
          for (int64_t u = 0; u < tt; ++u) block_max = std::max(block_max, pr[u]);
        } else {
          for (int64_t u = 0; u < tt; ++u) {
            const int64_t t = t0 + u;
            const bool quant = t < qlen[i];
            const bool readable = quant ? t < q_end : (t >= f_begin && t < f_end);
            float s = neg_inf();
            if (readable && visible(a, b, i, t)) s = dot(qr, (quant ? kq : kf).data() + u * D, D);
            pr[u] = s;
            block_max = std::max(block_max, s);
          }
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
      decode_rows(a, task, b, t0, q_end - t0, true, true, scratch, vq.data());
      decode_rows(a, task, b, f_begin, f_end - f_begin, true, false, scratch, vf.data() + (f_begin - t0) * D);
      for (int64_t rho = 0; rho < R; ++rho) {
        const int64_t i = rho % n;
        if (t0 > last_seen(a, b, i)) continue;
        const float* pr = p.data() + rho * kTile;
        float* ar = acc.data() + rho * D;
        // Tokens [t0, split) come from the codes, [split, t0 + tt) from the buffer.
        const int64_t split = std::clamp(qlen[i], t0, t0 + tt) - t0;
        accumulate(pr, 0, split, vq.data(), D, ar);
        accumulate(pr, split, tt, vf.data(), D, ar);
      }
    }
    for (int64_t rho = 0; rho < R; ++rho) {
      // Every query sees at least itself, so l > 0 unless its scores were NaN (then NaN out).
      const float inv = 1.f / l[rho];
      for (int64_t d = 0; d < D; ++d) out[rho * D + d] = acc[rho * D + d] * inv;
    }
  }
}

namespace {

// AVX-512 unless SPECDEC_CPU_ISA caps the ISA below it (kernels/common/cpu_isa.h), so tests and
// benches can run the portable kernel on an AVX-512 machine.
const bool kAvx512 = cpu_avx512_bw_vl_dq_fma_enabled();

}  // namespace

void quant_attention_cpu_tasks(const Args& a, int64_t task_begin, int64_t task_end) {
  if (kAvx512 && a.D % 16 == 0) {
    quant_attention_avx512_tasks(a, task_begin, task_end);
  } else {
    quant_attention_portable_tasks(a, task_begin, task_end);
  }
}

}  // namespace specdec::qattn
