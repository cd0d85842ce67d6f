// Attention over the hierarchical 4-bit KV cache on the CPU, torch-free (shared pieces and
// layouts: quant_attention.h; glue: csrc/ops/quant_attention_cpu.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/quant_attention/quant_attention.h"

namespace specdec::qattn {

// Tokens per tile of both CPU kernels: two 16-lane vectors of probabilities per query row; the
// decoded K and V tiles (2 * 32 * D floats, 32 KiB at D = 128) stay in L1 / L2 while the R query
// rows read them.
constexpr int64_t kTile = 32;

// One task's slab (row b, KV head h = task % Hkv). Query heads h*r .. h*r + r - 1 are adjacent in
// [B, Hq, n, D]: one [R, D] block of R = r * n query rows, row rho = head offset * n + new-token
// index, read at q and written at out.
struct Slab {
  int64_t b;
  const float* q;
  float* out;
  const int64_t* qlen;  // [n] tokens new token i reads from the codes
  int64_t qmin, qmax;   // fewest / most of them
  int64_t total;       // tokens 0 .. total - 1: the committed ones and the n new ones
  int64_t start;       // token held by buffer slot 0
};

// Starts `task`: its queries scaled by sm_scale into qf [R, D], the running softmax state reset
// (acc [R, D] = 0, m [R] = -inf, l [R] = 0).
inline Slab begin_slab(const Args& a, int64_t task, float* qf, float* acc, float* m, float* l) {
  const int64_t b = task / a.Hkv, h = task % a.Hkv, n = a.n, r = a.Hq / a.Hkv, R = r * n;
  Slab s;
  s.b = b;
  s.q = a.q + (b * a.Hq + h * r) * n * a.D;
  s.out = a.out + (b * a.Hq + h * r) * n * a.D;
  for (int64_t x = 0; x < R * a.D; ++x) qf[x] = s.q[x] * a.sm_scale;
  std::fill(acc, acc + R * a.D, 0.f);
  std::fill(m, m + R, neg_inf());
  std::fill(l, l + R, 0.f);
  s.qlen = a.quant_len + b * n;
  s.qmin = *std::min_element(s.qlen, s.qlen + n);
  s.qmax = *std::max_element(s.qlen, s.qlen + n);
  s.total = a.lengths[b] + n;
  s.start = a.buffer_start[b];
  return s;
}

// Token ranges of the tile [t0, t0 + tt) that some query of the slab reads from each source:
// codes [t0, q_end), buffer [f_begin, f_end) (empty ranges as begin == end).
struct TileRanges {
  int64_t q_end, f_begin, f_end;
};

inline TileRanges tile_ranges(const Args& a, const Slab& s, int64_t t0, int64_t tt) {
  TileRanges t;
  t.q_end = std::max(t0, std::min({t0 + tt, s.qmax, a.capacity}));
  t.f_begin = std::min(t0 + tt, std::max({t0, s.qmin, s.start}));
  t.f_end = std::max(t.f_begin, std::min(t0 + tt, s.start + a.F));
  return t;
}

// The (row, KV head) slabs task_begin .. task_end - 1 (task = b * Hkv + h). Each slab's tokens are
// dequantised once, in tiles, and serve all Hq / Hkv query heads times n new tokens of it. Runs
// the AVX-512 kernel when the CPU has it and D is a multiple of 16 (unless SPECDEC_CPU_ISA caps
// the ISA at avx2 / baseline), else the portable one.
void quant_attention_cpu_tasks(const Args& a, int64_t task_begin, int64_t task_end);

// The two kernels behind it (quant_attention_cpu.cpp and quant_attention_avx512.cpp); the AVX-512
// one needs D % 16 == 0 and a CPU with AVX-512 F / BW / VL / DQ and FMA
// (cpu_avx512_bw_vl_dq_fma_enabled() in kernels/common/cpu_isa.h).
void quant_attention_portable_tasks(const Args& a, int64_t task_begin, int64_t task_end);
void quant_attention_avx512_tasks(const Args& a, int64_t task_begin, int64_t task_end);

}  // namespace specdec::qattn
