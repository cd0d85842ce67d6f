// Row distributions for tree verification, on top of kernels/sampling/distribution.h.
//
// The per-element math (s = float(l) / T, exp_nonpos, Gumbel and exponential noise, the accept test
// u * q(x) < p(x), the race bookkeeping) is the sampling family's and is used as is. What that
// family keeps private to its CPU file, and the tree kernels need on both devices, is here: the
// filter description of a row (threshold, max, 1/Z) and the rule that finds the top-k / top-p
// thresholds.
//
// Thresholds by a bitwise search on order-preserving float keys: starting from key 0, bit b (31 down
// to 0) of the candidate is kept when the predicate still holds for every element with a key >= the
// candidate:  top-k: count >= k;  top-p: float(sum of p_i in double) >= top_p (torch.cumsum's
// double accumulation, as the sampling family's CPU kernel). The result is the largest key meeting
// the predicate, which is a key present in the row (count and mass change only at present keys):
// the k-th largest value, or the top-p cut. 32 counting passes; used only when the filter is on.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/hd.h"
#include "kernels/sampling/distribution.h"

namespace specdec {
namespace tree {

// One distribution row: keep s >= threshold; p_i = exp(s_i - max) / Z, written * inv_z.
struct RowDist {
  float threshold;  // -inf when nothing is filtered
  float max;        // max of s (always kept)
  float inv_z;      // 1 / Z over what is kept
};

SPECDEC_HD bool kept(const RowDist& d, float s) { return s >= d.threshold; }
SPECDEC_HD float prob(const RowDist& d, float s) {
  return s >= d.threshold ? sampling::exp_nonpos(s - d.max) * d.inv_z : 0.0f;
}
// Unnormalised weight exp(s - max) of a kept element (Z sums these).
SPECDEC_HD float weight(float threshold, float max, float s) {
  return s >= threshold ? sampling::exp_nonpos(s - max) : 0.0f;
}

// s of one logit: the sampling transform (true division, as the reference); greedy reads l itself.
SPECDEC_HD float scaled(float logit, float temperature) {
  return temperature > 0.0f ? logit / temperature : logit;
}

// A value that makes a row unusable unless it is the max: NaN or +inf (status 1).
SPECDEC_HD bool bad_value(float s) { return s != s || s == INFINITY; }

SPECDEC_HD bool top_k_active(int64_t top_k, int64_t vocab) { return top_k > 0 && top_k < vocab; }
SPECDEC_HD bool top_p_active(float top_p) { return top_p < 1.0f; }

// The bitwise threshold search, device-agnostic: pred(candidate_key) is evaluated by the caller's
// reduction (a loop on the CPU, a block reduction on CUDA) and must hold for candidate 0.
template <class Pred>
SPECDEC_HD float search_threshold(Pred&& pred) {
  uint32_t key = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t cand = key | (1u << bit);
    if (pred(cand)) key = cand;
  }
  return float_from_order_key(key);
}

// Top-p predicate from the mass at or above a candidate (double, as torch.cumsum on CPU).
SPECDEC_HD bool top_p_reached(double mass, float top_p) { return static_cast<float>(mass) >= top_p; }

}  // namespace tree
}  // namespace specdec
