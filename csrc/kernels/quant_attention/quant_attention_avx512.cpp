// Attention over the hierarchical 4-bit KV cache on an AVX-512 CPU (see quant_attention.h for the
// semantics and layouts; quant_attention_cpu.cpp for the portable kernel and the dispatch).
//
// Per (row b, KV head h) slab, the R = (Hq / Hkv) * n query rows that share the KV head are one
// block, and the tokens 0 .. lengths[b] + n - 1 go by in tiles of kTile:
//
//   codes ──decode once──> K rows [kTile, D] ──transpose──> Kᵀ [D, kTile]   (buffer keys: their own Kᵀ)
//   R query rows x Kᵀ (blocks of 4 rows, lanes = tokens) ──> scores [R, kTile] ── mask, exp ──> p
//   codes ──decode once──> V rows [kTile, D];  acc [R, D] = alpha * acc + p · V  (buffer rows in place)
//
// so a 5-token verification decodes each KV tile once for its 4 * 5 = 20 query rows, as decoding
// one token does for its 4. Dequantisation is the reference's formula (the compiler may fuse its
// multiply-add: the decoded K / V then differ from the reference's by an ulp at most).
//
// Every query row's arithmetic is the same sequence whatever the other rows are, and nothing about a
// token depends on the lane it sits in: a score is one fused-multiply-add chain over the channels
// in order, a probability one elementwise exp, the running sum and the accumulator chains over the
// visible tokens in token order. So query i of a verification forward, the same token decoded
// alone, and the same token as a tree node give the same bits (the property that makes
// quantspec's output equal autoregressive decoding on this cache).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/quant_attention/quant_attention_cpu.h"

#include "kernels/common/exp_avx512.h"

#if defined(__x86_64__)
// GCC 12's own avx512fintrin.h trips -Wmaybe-uninitialized in _mm512_setzero_ps-style helpers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

namespace specdec::qattn {
namespace {

#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma")))

// 16 channels of a packed row (8 bytes, channel 2c in the low nibble of byte c) as 16 floats.
SPECDEC_AVX512 inline __m512 nibbles16(const uint8_t* packed) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed));
  const __m128i mask = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(b, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
  return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)));
}

// x = upper * scale + zero (+ (lower - 8) * (scale / 16)): kv::dequantize_one's formula (scale *
// 0.0625 is scale / 16 exactly).
SPECDEC_AVX512 inline __m512 dequant16(const uint8_t* up, const uint8_t* lo, __m512 scale, __m512 zero,
                                       bool use_lower) {
  __m512 x = _mm512_add_ps(_mm512_mul_ps(nibbles16(up), scale), zero);
  if (use_lower) {
    const __m512 r = _mm512_sub_ps(nibbles16(lo), _mm512_set1_ps(8.f));
    x = _mm512_add_ps(x, _mm512_mul_ps(r, _mm512_mul_ps(scale, _mm512_set1_ps(0.0625f))));
  }
  return x;
}

// Rows [count, D] of tokens t0 .. t0 + count - 1 decoded from the codes of slab `task`: keys
// (one scale / zero per channel of the token's group) or values (one per value group of the
// token; `vscale` / `vzero` scratch of D floats for groups narrower than 16 channels).
SPECDEC_AVX512 void decode_rows(const Args& a, int64_t task, int64_t t0, int64_t count, bool values, float* vscale,
                                float* vzero, float* out) {
  const int64_t D = a.D, half = D / 2, vgroups = D / a.value_group;
  const uint8_t* upper = (values ? a.v_upper : a.k_upper) + (task * a.capacity + t0) * half;
  const uint8_t* lower = (values ? a.v_lower : a.k_lower) + (task * a.capacity + t0) * half;
  if (!values) {
    // Keys: one scale / zero row per group of key_group tokens (no division per token: the
    // group index moves on at each boundary).
    int64_t group = t0 / a.key_group, next = (group + 1) * a.key_group;
    const float* groups = a.k_scale + task * (a.capacity / a.key_group) * D;
    const float* zeros = a.k_zero + task * (a.capacity / a.key_group) * D;
    for (int64_t u = 0; u < count; ++u) {
      if (t0 + u == next) ++group, next += a.key_group;
      const float* sc = groups + group * D;
      const float* ze = zeros + group * D;
      for (int64_t c = 0; c < D; c += 16)
        _mm512_storeu_ps(out + u * D + c, dequant16(upper + u * half + c / 2, lower + u * half + c / 2,
                                                    _mm512_loadu_ps(sc + c), _mm512_loadu_ps(ze + c), a.use_lower));
    }
    return;
  }
  // Values: one scale / zero per value_group channels of the token.
  const float* sc_row = a.v_scale + (task * a.capacity + t0) * vgroups;
  const float* ze_row = a.v_zero + (task * a.capacity + t0) * vgroups;
  const int64_t chunks = a.value_group / 16;  // 16-channel chunks per group (0: narrower groups)
  for (int64_t u = 0; u < count; ++u) {
    const uint8_t* up = upper + u * half;
    const uint8_t* lo = lower + u * half;
    float* row = out + u * D;
    const float* sc = sc_row + u * vgroups;
    const float* ze = ze_row + u * vgroups;
    if (chunks > 0 && a.value_group % 16 == 0) {
      for (int64_t g = 0, c = 0; g < vgroups; ++g) {
        const __m512 s = _mm512_set1_ps(sc[g]), z = _mm512_set1_ps(ze[g]);
        for (int64_t j = 0; j < chunks; ++j, c += 16)
          _mm512_storeu_ps(row + c, dequant16(up + c / 2, lo + c / 2, s, z, a.use_lower));
      }
      continue;
    }
    for (int64_t g = 0; g < vgroups; ++g) {  // spread each group's scale / zero over its channels
      std::fill_n(vscale + g * a.value_group, a.value_group, sc[g]);
      std::fill_n(vzero + g * a.value_group, a.value_group, ze[g]);
    }
    for (int64_t c = 0; c < D; c += 16)
      _mm512_storeu_ps(row + c, dequant16(up + c / 2, lo + c / 2, _mm512_loadu_ps(vscale + c),
                                          _mm512_loadu_ps(vzero + c), a.use_lower));
  }
}

// 16 rows of 16 floats (rows[i] + c0) -> out[j * kTile + i] = rows[i][c0 + j]: the classic
// three-stage AVX-512 transpose (unpack, in-lane shuffle, two 128-bit-lane shuffles), 64 shuffles
// per 256 floats.
SPECDEC_AVX512 inline void transpose16(const float* const* rows, int64_t c0, float* out) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(rows[i] + c0);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
  for (int j = 0; j < 16; ++j) _mm512_storeu_ps(out + j * kTile, r[j]);
}

// Keys of a tile transposed: kt [D, kTile] from kTile row pointers (a token no query reads from
// this source points at a row of zeros).
SPECDEC_AVX512 void transpose_tile(const float* const* rows, int64_t D, float* kt) {
  for (int64_t c0 = 0; c0 < D; c0 += 16) {
    transpose16(rows, c0, kt + c0 * kTile);
    transpose16(rows + 16, c0, kt + c0 * kTile + 16);
  }
}

// Scores of RB query rows against the tile's kTile keys: s[rho][u] = q_rho · k_u, lanes = tokens,
// one fused multiply-add chain per (row, token) over the channels in order (so a row's scores are
// the same bits whatever rows share its block). 2 * RB independent chains hide the FMA latency.
template <int RB>
SPECDEC_AVX512 void scores_block(const float* const* q, const float* kt, int64_t D, float* const* s) {
  __m512 acc[RB][2];
  for (int j = 0; j < RB; ++j) acc[j][0] = acc[j][1] = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; ++d) {
    const __m512 k0 = _mm512_loadu_ps(kt + d * kTile), k1 = _mm512_loadu_ps(kt + d * kTile + 16);
    for (int j = 0; j < RB; ++j) {
      const __m512 qd = _mm512_set1_ps(q[j][d]);
      acc[j][0] = _mm512_fmadd_ps(qd, k0, acc[j][0]);
      acc[j][1] = _mm512_fmadd_ps(qd, k1, acc[j][1]);
    }
  }
  for (int j = 0; j < RB; ++j) {
    _mm512_storeu_ps(s[j], acc[j][0]);
    _mm512_storeu_ps(s[j] + 16, acc[j][1]);
  }
}

SPECDEC_AVX512 void scores(int rows, const float* const* q, const float* kt, int64_t D, float* const* s) {
  switch (rows) {
    case 1: scores_block<1>(q, kt, D, s); break;
    case 2: scores_block<2>(q, kt, D, s); break;
    case 3: scores_block<3>(q, kt, D, s); break;
    default: scores_block<4>(q, kt, D, s); break;
  }
}

// exp(s - m) for scores s <= m (the running max), s = -inf (masked) -> 0 (exp16_avx512 of
// kernels/common/exp_avx512.h, then the masked lanes zeroed).
SPECDEC_AVX512 inline __m512 exp_shifted16(__m512 s, __m512 m) {
  const __m512 e = exp16_avx512(_mm512_sub_ps(s, m));
  // -inf (masked) -> 0.
  const __mmask16 masked = _mm512_cmp_ps_mask(s, _mm512_set1_ps(-INFINITY), _CMP_EQ_OQ);
  return _mm512_mask_blend_ps(masked, e, _mm512_setzero_ps());
}

// acc[0 .. D) = acc * alpha + sum over u in [0, tt) with p[u] != 0 of p[u] * rows(u) (rows from
// the codes below `split`, from the buffer at and above it), and l = l * alpha + the same p[u]
// added one by one in token order. Masked tokens (p = 0) are skipped: their rows may hold
// anything, NaN included; and as nothing about a token depends on its lane, a tree's node and the
// same token of a chain (another slot, other masked tokens around it) get the same bits.
// CH accumulators of 16 channels (channels c0 .. c0 + 16 CH) kept in registers across the tile.
template <int CH>
SPECDEC_AVX512 inline void accumulate_chunk(float* acc, float alpha, const float* p, int64_t tt, int64_t split,
                                            const float* quant_rows, const float* buffer_rows, int64_t D,
                                            int64_t c0) {
  __m512 v[CH];
  const __m512 al = _mm512_set1_ps(alpha);
  for (int j = 0; j < CH; ++j) v[j] = _mm512_mul_ps(_mm512_loadu_ps(acc + c0 + 16 * j), al);
  for (int64_t u = 0; u < tt; ++u) {
    if (p[u] == 0.f) continue;
    const __m512 w = _mm512_set1_ps(p[u]);
    const float* row = (u < split ? quant_rows : buffer_rows) + u * D + c0;
    for (int j = 0; j < CH; ++j) v[j] = _mm512_fmadd_ps(w, _mm512_loadu_ps(row + 16 * j), v[j]);
  }
  for (int j = 0; j < CH; ++j) _mm512_storeu_ps(acc + c0 + 16 * j, v[j]);
}

SPECDEC_AVX512 void accumulate(float* acc, float& l, float alpha, const float* p, int64_t tt, int64_t split,
                               const float* quant_rows, const float* buffer_rows, int64_t D) {
  float sum = l * alpha;
  for (int64_t u = 0; u < tt; ++u)
    if (p[u] != 0.f) sum += p[u];
  l = sum;
  int64_t c0 = 0;
  for (; c0 + 128 <= D; c0 += 128) accumulate_chunk<8>(acc, alpha, p, tt, split, quant_rows, buffer_rows, D, c0);
  for (; c0 < D; c0 += 16) accumulate_chunk<1>(acc, alpha, p, tt, split, quant_rows, buffer_rows, D, c0);
}

}  // namespace

SPECDEC_AVX512 void quant_attention_avx512_tasks(const Args& a, int64_t task_begin, int64_t task_end) {
  const int64_t D = a.D, n = a.n, r = a.Hq / a.Hkv, R = r * n;
  std::vector<float> qf(R * D), acc(R * D), m(R), l(R), alpha_r(R), p(R * kTile), vscale(D), vzero(D);
  // Tile scratch on 64-byte boundaries: every 16-float store of the decode and the transpose is
  // one cache line (a line-splitting store costs two, and the transpose is store-bound).
  std::vector<float> scratch(4 * kTile * D + 16, 0.f);
  float* const tile = scratch.data() + (16 - reinterpret_cast<uintptr_t>(scratch.data()) / 4 % 16) % 16;
  float* const krows = tile;               // [kTile, D] keys decoded from the codes
  float* const vrows = tile + kTile * D;   // [kTile, D] values decoded from the codes
  float* const kqt = tile + 2 * kTile * D;  // [D, kTile] krows transposed
  float* const kft = tile + 3 * kTile * D;  // [D, kTile] buffer keys transposed
  std::vector<float> zeros(D, 0.f), sq(R * kTile), sf(R * kTile);
  for (int64_t task = task_begin; task < task_end; ++task) {
    const Slab slab = begin_slab(a, task, qf.data(), acc.data(), m.data(), l.data());
    const int64_t b = slab.b;
    const int64_t* qlen = slab.qlen;
    float* out = slab.out;
    // Buffer row of token t: buffer_rows + t * D (t within the buffer's window).
    const float* kbuf = a.k_buffer + task * a.F * D - slab.start * D;
    const float* vbuf = a.v_buffer + task * a.F * D - slab.start * D;
    for (int64_t t0 = 0; t0 < slab.total; t0 += kTile) {
      const int64_t tt = std::min(kTile, slab.total - t0);
      // Codes [t0, q_end) (decoded once), buffer [f_begin, f_end): what some query reads from each.
      const auto [q_end, f_begin, f_end] = tile_ranges(a, slab, t0, tt);
      decode_rows(a, task, t0, q_end - t0, false, vscale.data(), vzero.data(), krows);
      const float* qrows[kTile];
      const float* frows[kTile];
      for (int64_t u = 0; u < kTile; ++u) {
        const int64_t t = t0 + u;
        qrows[u] = t < q_end ? krows + u * D : zeros.data();
        frows[u] = t >= f_begin && t < f_end ? kbuf + t * D : zeros.data();
      }
      if (q_end > t0) transpose_tile(qrows, D, kqt);
      if (f_end > f_begin) transpose_tile(frows, D, kft);
      // Scores from the codes (sq) and from the buffer (sf) for blocks of 4 query rows, each
      // computed where some row of the block reads that source in this tile.
      for (int64_t rho0 = 0; rho0 < R; rho0 += 4) {
        const int rows = static_cast<int>(std::min<int64_t>(4, R - rho0));
        const float* qb[4];
        float* sqb[4];
        float* sfb[4];
        bool need_q = false, need_f = false;
        for (int j = 0; j < rows; ++j) {
          const int64_t rho = rho0 + j, i = rho % n;
          qb[j] = qf.data() + rho * D;
          sqb[j] = sq.data() + rho * kTile;
          sfb[j] = sf.data() + rho * kTile;
          if (t0 > last_seen(a, b, i)) continue;
          need_q = need_q || qlen[i] > t0;
          need_f = need_f || qlen[i] < t0 + tt;
        }
        if (need_q) scores(rows, qb, kqt, D, sqb);
        if (need_f) scores(rows, qb, kft, D, sfb);
      }
      for (int64_t rho = 0; rho < R; ++rho) {
        const int64_t i = rho % n, last = last_seen(a, b, i);
        float* pr = p.data() + rho * kTile;
        if (t0 > last) {  // the whole tile lies after what query i sees (prefill)
          std::fill_n(pr, kTile, neg_inf());
          continue;
        }
        const int64_t split = std::clamp(qlen[i], t0, t0 + tt) - t0;  // codes below, buffer from here
        const __mmask16 from_q0 = static_cast<__mmask16>(split >= 16 ? 0xffff : (1u << split) - 1);
        const __mmask16 from_q1 = static_cast<__mmask16>(split >= 32 ? 0xffff : split <= 16 ? 0 : (1u << (split - 16)) - 1);
        _mm512_storeu_ps(pr, _mm512_mask_blend_ps(from_q0, _mm512_loadu_ps(sf.data() + rho * kTile),
                                                  _mm512_loadu_ps(sq.data() + rho * kTile)));
        _mm512_storeu_ps(pr + 16, _mm512_mask_blend_ps(from_q1, _mm512_loadu_ps(sf.data() + rho * kTile + 16),
                                                       _mm512_loadu_ps(sq.data() + rho * kTile + 16)));
        // Masks: tokens past the end, not visible to query i, or not readable where it reads them.
        // A whole tile of committed tokens, each readable, needs none (the bulk of a long context).
        const bool buffer_ok = split == tt || (t0 + split >= slab.start && t0 + tt <= slab.start + a.F);
        if (!(tt == kTile && t0 + tt <= a.lengths[b] && buffer_ok)) {
          for (int64_t u = 0; u < kTile; ++u) {
            const int64_t t = t0 + u;
            const bool readable = u < tt && (u < split ? t < q_end : in_buffer(a, b, t));
            if (!(readable && t <= last && visible(a, b, i, t))) pr[u] = neg_inf();
          }
        }
        // Online softmax over the tile: running max, rescale, probabilities, running sum.
        const __m512 s0 = _mm512_loadu_ps(pr), s1 = _mm512_loadu_ps(pr + 16);
        const float block_max = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
        const float alpha = online_rescale(m[rho], block_max);
        const __m512 mm = _mm512_set1_ps(m[rho]);
        const __m512 e0 = exp_shifted16(s0, mm), e1 = exp_shifted16(s1, mm);
        _mm512_storeu_ps(pr, e0);
        _mm512_storeu_ps(pr + 16, e1);
        alpha_r[rho] = alpha;
      }
      decode_rows(a, task, t0, q_end - t0, true, vscale.data(), vzero.data(), vrows);
      for (int64_t rho = 0; rho < R; ++rho) {
        const int64_t i = rho % n;
        if (t0 > last_seen(a, b, i)) continue;
        const int64_t split = std::clamp(qlen[i], t0, t0 + tt) - t0;
        accumulate(acc.data() + rho * D, l[rho], alpha_r[rho], p.data() + rho * kTile, tt, split, vrows,
                   vbuf + t0 * D, D);
      }
    }
    for (int64_t rho = 0; rho < R; ++rho) {
      // Every query sees at least itself, so l > 0 unless its scores were NaN (then NaN out).
      const float inv = 1.f / l[rho];
      for (int64_t c = 0; c < D; ++c) out[rho * D + c] = acc[rho * D + c] * inv;
    }
  }
}

}  // namespace specdec::qattn

#else  // not x86-64: the portable kernel only

namespace specdec::qattn {
void quant_attention_avx512_tasks(const Args&, int64_t, int64_t) {}
}  // namespace specdec::qattn

#endif
