// Per-element math of a sampling distribution, shared by the CPU and CUDA kernels (and by the tree
// verification kernels): reuse these, do not re-derive them.
//
// A logit row l (fp32 / fp16 / bf16) with temperature T > 0 becomes s = float(l) / T (a true IEEE
// division, as the reference does; not a multiply by 1/T). Top-k / top-p keep s >= threshold
// (threshold = -inf when off), and p = softmax over what is kept:
//     p_i = exp(s_i - m) / Z,   m = max_i s_i,   Z = sum_{kept} exp(s_i - m).
// Nothing here writes a probability vector; everything is a per-element function of s_i plus a few
// row statistics (m, Z, threshold), so a kernel makes one pass (or a few) over the logits.
//
// Sampling is an exponential race over the stream (seed, position, purpose, substream): element i
// draws u_i = uniform_open01(bits_i) and the winner is
//     argmax_i  s_i + G_i,   G_i = -log(-log(u_i))          (Gumbel-max; ties to the lowest index)
// and the residual max(0, p - q) after a rejection is sampled without normalising it by
//     argmax_i  r_i / E_i,   E_i = -log(u_i).
// Exact pruning: u_i <= 1 - 2^-24, so G_i <= 16.64 and E_i >= 5.96e-8. An element whose bound
// (s_i + kGumbelMax, r_i * kInvExpNoiseMin) is below the best key found so far cannot win (nor tie),
// so its Philox draw and logarithms are skipped; the result equals the full evaluation.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/hd.h"
#include "kernels/common/philox.h"

namespace specdec {
namespace sampling {

// Upper bound of every Gumbel draw: -log(-log(1 - 2^-24)) = 16.6355; 17 leaves room for rounding.
constexpr float kGumbelMax = 17.0f;
// Upper bound of 1 / E_i: 1 / -log(1 - 2^-24) = 1.6777e7; 1.7e7 leaves room for rounding.
constexpr float kInvExpNoiseMin = 1.7e7f;
// exp(x) for x below this is flushed to 0 (exp(-87) = 1.6e-38 is below float's normal range).
constexpr float kExpUnderflow = -87.0f;

// exp(x) for x <= 0 (s_i - m), branch-free so `#pragma omp simd` loops vectorise it and both devices
// compute bit-comparable values. Cody-Waite range reduction x = n ln2 + r, |r| <= ln2 / 2, then the
// Cephes degree-6 polynomial (about 1 ulp); exp(-inf) = 0.
SPECDEC_HD float exp_nonpos(float x) {
  const float kLog2e = 1.44269504088896341f;
  const float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  const float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float xc = x < kExpUnderflow ? kExpUnderflow : x;  // also maps -inf
  const float n = (xc * kLog2e + kRound) - kRound;
  float r = xc - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  poly = poly * r * r + r + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;  // n in [-126, 0]: 2^n is a normal float
  const uint32_t scale_bits = static_cast<uint32_t>(e) << 23;
  float scale;
#if defined(__CUDA_ARCH__)
  scale = __uint_as_float(scale_bits);
#else
  __builtin_memcpy(&scale, &scale_bits, sizeof(scale));
#endif
  return x < kExpUnderflow ? 0.0f : poly * scale;
}

// log(x) for positive normal x (u in (0, 1), E = -log(u) >= 5.96e-8), branch-free so the CPU race
// vectorises it, and the same on both devices. x = f 2^e with f in [sqrt(1/2), sqrt(2)), then the
// Cephes degree-9 polynomial of log(1 + (f - 1)) (about 1 ulp; relative accuracy kept near x = 1,
// where f - 1 is exact).
SPECDEC_HD float log_positive(float x) {
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(x);
#else
  __builtin_memcpy(&bits, &x, sizeof(bits));
#endif
  float e = static_cast<float>(static_cast<int32_t>((bits >> 23) & 0xffu) - 126);
  const uint32_t mant_bits = (bits & 0x007fffffu) | 0x3f000000u;  // f in [0.5, 1)
  float f;
#if defined(__CUDA_ARCH__)
  f = __uint_as_float(mant_bits);
#else
  __builtin_memcpy(&f, &mant_bits, sizeof(f));
#endif
  const bool small = f < 0.707106781186547524f;
  e = small ? e - 1.0f : e;
  f = small ? (f + f) - 1.0f : f - 1.0f;
  const float z = f * f;
  float y = 7.0376836292e-2f;
  y = y * f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  y = y * f * z;
  y += -2.12194440e-4f * e;
  y += -0.5f * z;
  float r = f + y;
  r += 0.693359375f * e;
  return r;
}

// Gumbel noise G = -log(-log(u)) of one raw draw.
SPECDEC_HD float gumbel_noise(uint32_t bits) {
  const float u = uniform_open01(bits);
  return -log_positive(-log_positive(u));
}

// Exponential noise E = -log(u) of one raw draw (the residual race divides by it).
SPECDEC_HD float exp_noise(uint32_t bits) { return -log_positive(uniform_open01(bits)); }

// Rejection sampling's test, min(1, p/q) written without a division: accept when u * q(x) < p(x),
// in float32. u < 1 always, so p(x) = 0 is never accepted and p(x) >= q(x) > 0 always is.
SPECDEC_HD bool accept_draft(float u, float q_x, float p_x) { return u * q_x < p_x; }

// Medusa's typical acceptance (lossy): accept when p(x) > min(epsilon, alpha * exp(-H(p))), in
// double as the reference computes it.
SPECDEC_HD bool accept_typical(float p_x, float entropy, double epsilon, double alpha) {
  const double by_entropy = alpha * exp(-static_cast<double>(entropy));
  const double threshold = epsilon < by_entropy ? epsilon : by_entropy;
  return static_cast<double>(p_x) > threshold;
}

// Race bookkeeping: the larger key wins, ties to the lower index (torch.argmax's rule).
struct RaceBest {
  float key;
  int64_t index;
  SPECDEC_HD static RaceBest none() { return {-INFINITY, INT64_MAX}; }  // loses to any offer
  SPECDEC_HD void offer(float k, int64_t i) {
    if (k > key || (k == key && i < index)) {
      key = k;
      index = i;
    }
  }
  // Combines two partial races (threads, lanes, tiles): the same winner as one race over both.
  SPECDEC_HD static RaceBest merge(RaceBest a, const RaceBest& b) {
    a.offer(b.key, b.index);
    return a;
  }
};

// ---- the races, element by element (every race of every op goes through these) ----------------
//
// A race is argmax_i key(v_i, draw_i) over the elements that take part, ties to the lower index.
// An element may still win (or tie) only while its bound reaches the best key so far; one that
// cannot is skipped without its Philox draw, which keeps the result exact.
//   GumbelRace    v = s_i (kept, else -inf)   key s_i + G_i   bound s_i + kGumbelMax
//   ResidualRace  v = r_i = max(0, p_i - q_i)  key r_i / E_i   bound r_i * kInvExpNoiseMin
struct GumbelRace {
  SPECDEC_HD static bool takes_part(float s) { return s > -INFINITY; }
  SPECDEC_HD static bool may_win(float s, float best_key) {
    return takes_part(s) && s + kGumbelMax >= best_key;
  }
  SPECDEC_HD static float key(float s, uint32_t bits) { return s + gumbel_noise(bits); }
};

struct ResidualRace {
  SPECDEC_HD static bool takes_part(float r) { return r > 0.0f; }
  SPECDEC_HD static bool may_win(float r, float best_key) {
    return takes_part(r) && r * kInvExpNoiseMin >= best_key;
  }
  SPECDEC_HD static float key(float r, uint32_t bits) { return r / exp_noise(bits); }
};

SPECDEC_HD bool gumbel_may_win(float s, float best_key) { return GumbelRace::may_win(s, best_key); }
SPECDEC_HD float gumbel_key(float s, uint32_t bits) { return GumbelRace::key(s, bits); }
SPECDEC_HD bool residual_may_win(float r, float best_key) {
  return ResidualRace::may_win(r, best_key);
}
SPECDEC_HD float residual_key(float r, uint32_t bits) { return ResidualRace::key(r, bits); }

// Offers elements 4g .. 4g+3, which share one Philox block, to a race (Race: GumbelRace or
// ResidualRace; v[k] an element that does not take part, or past the row: -inf / 0); the block
// is drawn only when one of them may win.
template <class Race>
SPECDEC_HD void offer_group(const RandomStream& stream, int64_t g, const float (&v)[4],
                            RaceBest& best) {
  bool any = false;
  for (int k = 0; k < 4; ++k) any |= Race::may_win(v[k], best.key);
  if (!any) return;
  const PhiloxOut bits = stream.block(static_cast<uint32_t>(g));
  for (int k = 0; k < 4; ++k)
    if (Race::takes_part(v[k])) best.offer(Race::key(v[k], bits.x[k]), 4 * g + k);
}

// Online softmax statistics of a set of scaled logits:
//   max = m, sum = sum exp(s - m), dot = sum exp(s - m) * (s - m)   (dot gives the entropy)
// merge() combines two partial states (threads, lanes), so one pass yields all three.
struct SoftmaxStats {
  float max;
  float sum;
  float dot;
  SPECDEC_HD static SoftmaxStats empty() { return {-INFINITY, 0.0f, 0.0f}; }
  SPECDEC_HD void add(float s) {
    if (s > max) {
      const float scale = exp_nonpos(max - s);  // max = -inf gives 0
      dot = (dot + sum * (max - s)) * scale;
      if (max == -INFINITY) dot = 0.0f;
      sum = sum * scale;
      max = s;
    }
    if (s > -INFINITY) {
      const float e = exp_nonpos(s - max);
      sum += e;
      dot += e * (s - max);
    }
  }
  SPECDEC_HD static SoftmaxStats merge(const SoftmaxStats& a, const SoftmaxStats& b) {
    if (a.max == -INFINITY) return b;
    if (b.max == -INFINITY) return a;
    const float m = a.max > b.max ? a.max : b.max;
    const float ea = exp_nonpos(a.max - m), eb = exp_nonpos(b.max - m);
    SoftmaxStats out;
    out.max = m;
    out.sum = a.sum * ea + b.sum * eb;
    out.dot = ea * (a.dot + a.sum * (a.max - m)) + eb * (b.dot + b.sum * (b.max - m));
    return out;
  }
  // H(p) = log Z - E_p[s - m]
  SPECDEC_HD float entropy() const { return logf(sum) - dot / sum; }
};

// A value that makes its row unusable wherever it is: NaN or +inf.
SPECDEC_HD bool nan_or_posinf(float s) { return s != s || s == INFINITY; }

// What makes a row of logits unusable (kStatusNonFiniteLogits): NaN or +inf anywhere, or nothing
// above -inf.
SPECDEC_HD bool row_unusable(bool saw_nan_or_posinf, float max) {
  return saw_nan_or_posinf || !(max > -INFINITY);
}

}  // namespace sampling
}  // namespace specdec
