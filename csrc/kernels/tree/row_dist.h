// Per-element pieces of the sampling transform used by tree verification (CPU and CUDA).
//
// The semantics are those of python/specdec_cuda/reference/sampling.py: s = float32(l) / T;
// top-k keeps s >= (k-th largest s); top-p keeps s >= t for the largest t whose kept mass
// P(s >= t) >= top_p; p = softmax over what is kept. Reductions (max, sums, argmax) are written
// per device (a loop on the CPU, block reductions on CUDA); what is per element lives here so both
// devices compute each element the same way.
//
// The thresholds are found by a bitwise search on order-preserving float keys: starting from
// key 0, bit b (31 down to 0) is set when "enough" elements (count >= k, or mass >= top_p * S) have
// a key >= the candidate. This yields the largest key K meeting the predicate, which is a key
// present in the row (the count / mass only changes at present keys): the k-th largest value, or
// the top-p cut. 32 counting passes, used only when top-k / top-p are enabled.
//
// Written here, not taken from csrc/kernels/sampling (being written in parallel): when that family
// lands, these helpers are the candidates to replace by its row-distribution headers.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/hd.h"
#include "kernels/common/philox.h"

namespace specdec {
namespace tree {

SPECDEC_HD float neg_inf() { return -INFINITY; }

// A logit that makes the row unusable (NaN or +inf; all -inf is checked separately).
SPECDEC_HD bool bad_logit(float s) { return s != s || s == INFINITY; }

// Gumbel-race key of token i: s_i + G_i, G_i = -log(-log(u_i)); removed tokens never win.
SPECDEC_HD float gumbel_key(float s, bool kept, uint32_t bits) {
  if (!kept) return neg_inf();
  const float u = uniform_open01(bits);
  return s + (-logf(-logf(u)));
}

// Residual-race key: r_i / E_i with E_i = -log(u_i); r_i <= 0 never wins (key -1).
SPECDEC_HD float residual_key(float r, uint32_t bits) {
  if (!(r > 0.0f)) return -1.0f;
  const float u = uniform_open01(bits);
  return r / (-logf(u));
}

// Argmax combine with ties to the lowest index (as torch.argmax).
struct ArgMax {
  float value;
  int64_t index;
};
SPECDEC_HD ArgMax argmax_combine(ArgMax a, ArgMax b) {
  if (b.index < 0) return a;
  if (a.index < 0) return b;
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// Online softmax normaliser: (max, sum of exp(x - max)) merged from partial results.
struct MaxSum {
  float max;
  float sum;
};
SPECDEC_HD MaxSum maxsum_combine(MaxSum a, MaxSum b) {
  if (a.max == neg_inf()) return b;
  if (b.max == neg_inf()) return a;
  const float m = a.max > b.max ? a.max : b.max;
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

// Validity flags of a row: a NaN / +inf seen, and whether every value was -inf.
struct RowFlags {
  bool bad;
  bool all_neg_inf;
};
SPECDEC_HD RowFlags flags_combine(RowFlags a, RowFlags b) {
  return {a.bad || b.bad, a.all_neg_inf && b.all_neg_inf};
}
SPECDEC_HD RowFlags flags_of(float s) { return {bad_logit(s), s == neg_inf()}; }
SPECDEC_HD bool flags_unusable(RowFlags f) { return f.bad || f.all_neg_inf; }

// Filter description of one distribution row: keep s >= threshold; p = exp(s - max) / sum.
struct RowDist {
  float threshold;  // -inf when nothing is filtered
  float max;        // max of s (always kept)
  float sum;        // sum over kept of exp(s - max)
};

SPECDEC_HD bool kept(const RowDist& d, float s) { return s >= d.threshold; }
SPECDEC_HD float prob(const RowDist& d, float s) {
  return kept(d, s) ? expf(s - d.max) / d.sum : 0.0f;
}

// Whether top-k / top-p filtering applies to a row of `vocab` tokens.
SPECDEC_HD bool top_k_active(int64_t top_k, int64_t vocab) { return top_k > 0 && top_k < vocab; }
SPECDEC_HD bool top_p_active(float top_p) { return top_p < 1.0f; }

}  // namespace tree
}  // namespace specdec
