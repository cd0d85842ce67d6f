// Top-k / top-p filtering of one scaled logit row, shared by sample, verify_chain and verify_tree
// on both devices: what a filtered row is (RowDist) and the rule that finds its threshold.
//
// A row s (s = float(l) / T, distribution.h) keeps s >= threshold; p_i = exp(s_i - max) / Z over
// what is kept. top-k's threshold is the k-th largest s (ties kept); top-p's is the largest kept
// value t with float(P(s >= t)) >= top_p under the top-k-filtered softmax, P summed in double as
// torch.cumsum does on CPU (-inf, nothing cut, when rounding leaves the total below top_p).
//
// Both thresholds are found by radix select on order keys (dtype.h float_order_key: larger float,
// larger key): kRadixRounds rounds of kRadixBits bits, most significant digit first. Each round
// histograms, by their next digit, the keys that share the digits chosen so far
//     top-k:  count[d]  elements                      pick_count_digit
//     top-p:  mass[d]   sum of p_i (double)           pick_mass_digit
// and descends into one digit. After the last round the prefix is a key present in the row: the
// threshold itself. Each device fills the histograms its own way (a loop over a shrinking
// candidate list on the CPU, shared-memory atomics of one block on CUDA); the choice of digit, and
// so the result, is this file's.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/hd.h"
#include "kernels/sampling/distribution.h"

namespace specdec {
namespace sampling {

// One filtered row: keep s >= threshold; p_i = exp(s_i - max) * inv_z for a kept element.
struct RowDist {
  float max;        // max of s (always kept)
  float threshold;  // -inf when nothing is filtered
  float inv_z;      // 1 / Z over what is kept (0 when the caller did not need probabilities)
};

SPECDEC_HD bool kept(const RowDist& d, float s) { return s >= d.threshold; }
// Unnormalised weight exp(s - max) of a kept element (Z sums these), 0 for a removed one.
SPECDEC_HD float weight(float threshold, float max, float s) {
  return s >= threshold ? exp_nonpos(s - max) : 0.0f;
}
// p of one element (the product is selected, not multiplied by a selected weight: the expression
// every kernel has always evaluated, so no compiler contracts it differently into an FMA).
SPECDEC_HD float prob(const RowDist& d, float s) {
  return s >= d.threshold ? exp_nonpos(s - d.max) * d.inv_z : 0.0f;
}

SPECDEC_HD bool top_k_active(int64_t top_k, int64_t vocab) { return top_k > 0 && top_k < vocab; }
SPECDEC_HD bool top_p_active(float top_p) { return top_p < 1.0f; }

// ---- radix select ------------------------------------------------------------------------------

constexpr int kRadixBits = 8;
constexpr int kRadixBuckets = 1 << kRadixBits;     // 256 histogram bins (1 KiB of shared counts)
constexpr int kRadixRounds = 32 / kRadixBits;      // 4 rounds cover the 32-bit key

// The digits chosen so far: keys with (key & mask) == prefix are still candidates.
struct RadixPrefix {
  uint32_t prefix = 0;
  uint32_t mask = 0;
  int shift = 32 - kRadixBits;  // position of the digit the current round picks

  SPECDEC_HD bool first_round() const { return shift == 32 - kRadixBits; }
  SPECDEC_HD bool matches(uint32_t key) const { return (key & mask) == prefix; }
  SPECDEC_HD uint32_t digit(uint32_t key) const { return (key >> shift) & (kRadixBuckets - 1u); }
  SPECDEC_HD void descend(uint32_t d) {
    prefix |= d << shift;
    mask |= static_cast<uint32_t>(kRadixBuckets - 1) << shift;
    shift -= kRadixBits;
  }
  SPECDEC_HD float value() const { return float_from_order_key(prefix); }  // after the last round
};

// top-k round: count[d] candidates have digit d; `remaining` is the rank (1-based, from the top)
// still sought among the candidates. Returns the digit holding it and lowers `remaining` by the
// candidates above that digit.
template <typename Count>
SPECDEC_HD uint32_t pick_count_digit(const Count* count, int64_t& remaining) {
  int64_t above = 0;
  int d = kRadixBuckets - 1;
  for (; d > 0; --d) {
    if (above + count[d] >= remaining) break;
    above += count[d];
  }
  remaining -= above;
  return static_cast<uint32_t>(d);
}

// top-p round: mass[d] is the probability of the candidates with digit d, `above` the probability
// of every element above all candidates. Returns the first digit from the top at which
// float(above + mass down to it) >= top_p and adds the mass above that digit to `above`; -1 when
// no cut exists (the threshold is then -inf). Past the first round a cut exists by construction,
// but the double sums of this round, taken in another order than the previous round's, can fall
// short by an ulp: then the smallest non-empty digit is taken.
SPECDEC_HD int pick_mass_digit(const double* mass, double& above, float top_p, bool first_round) {
  double cum = above;
  int d = kRadixBuckets - 1, last_nonempty = -1;
  for (; d >= 0; --d) {
    if (mass[d] > 0.0) last_nonempty = d;
    if (static_cast<float>(cum + mass[d]) >= top_p) break;
    cum += mass[d];
  }
  if (d < 0) {
    if (first_round || last_nonempty < 0) return -1;
    d = last_nonempty;
    cum -= mass[d];
  }
  above = cum;
  return d;
}

}  // namespace sampling
}  // namespace specdec
