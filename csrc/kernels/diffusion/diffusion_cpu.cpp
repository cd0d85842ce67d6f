// CPU kernels of `diffusion_unmask` (torch-free). Per masked position, a few passes over a float
// buffer of the scaled row s (decoded once):
//   scan        max m and the NaN / +inf flag
//   top-k       32 counting passes (bisection over order keys, unmask.h)      only when top-k is on
//   Z           sum over kept of exp(s - m)
//   top-p       32 mass passes (bisection over order keys), then Z again     only when top-p is on
//   race        Gumbel race over the kept entries; confidence = exp(s_x - m) / Z
// The vocabularies of diffusion LMs served here are small and the window is one block, so this
// favours sharing the exact search with the CUDA kernel over the sampling family's radix selects.
#include "kernels/diffusion/diffusion_cpu.h"

#include <cmath>
#include <vector>

namespace specdec {
namespace diffusion {
namespace {

struct Decided {
  int64_t token;
  float confidence;
  int32_t status;
};

Decided decide(const UnmaskArgs& a, int64_t b, int64_t w, std::vector<float>& s) {
  const int64_t V = a.vocab;
  const float temperature = a.temperature[b];
  const bool greedy = temperature == 0.0f;
  // s = float(l) / T (a true division, as the reference; T = 1 for greedy, which is exact)
  const float divisor = greedy ? 1.0f : temperature;
  float m = -INFINITY;
  bool bad = false;
  for (int64_t i = 0; i < V; ++i) {
    const float x = logit_at(a, b, w, i) / divisor;
    s[i] = x;
    m = x > m ? x : m;
    bad = bad || x != x || x == INFINITY;
  }
  if (sampling::row_unusable(bad, m)) return {-1, -INFINITY, kStatusNonFiniteLogits};

  float t = -INFINITY;  // keep s >= t
  if (greedy) {
    int64_t x = 0;
    while (s[x] != m) ++x;  // the first maximum, as torch.argmax
    float z = 0.0f;
    for (int64_t i = 0; i < V; ++i) z += kept_weight(s[i], m, t);
    return {x, 1.0f / z, kStatusOk};
  }
  const int32_t top_k = a.top_k[b];
  if (top_k > 0 && top_k < V) {
    const uint32_t key = largest_key_where([&](uint32_t trial) {
      int64_t count = 0;
      for (int64_t i = 0; i < V; ++i) count += float_order_key(s[i]) >= trial;
      return count >= top_k;
    });
    t = float_from_order_key(key);
  }
  float z = 0.0f;
  for (int64_t i = 0; i < V; ++i) z += kept_weight(s[i], m, t);
  const float top_p = a.top_p[b];
  if (top_p < 1.0f) {
    const float inv_z = 1.0f / z;
    // mass of the kept entries with order key >= trial, accumulated in double (as the sampling
    // family does; the reference's float32 cumsum agrees except at a rounding knife-edge)
    auto reaches = [&](uint32_t trial) {
      double mass = 0.0;
      for (int64_t i = 0; i < V; ++i) {
        if (float_order_key(s[i]) >= trial) mass += kept_weight(s[i], m, t) * inv_z;
      }
      return static_cast<float>(mass) >= top_p;
    };
    if (reaches(0u)) {  // otherwise rounding left the total below top_p: everything stays
      const float cut = float_from_order_key(largest_key_where(reaches));
      if (cut > t) {
        t = cut;
        z = 0.0f;
        for (int64_t i = 0; i < V; ++i) z += kept_weight(s[i], m, t);
      }
    }
  }
  const RandomStream stream = position_stream(a, b, w);
  sampling::RaceBest best{-INFINITY, V};
  for (int64_t i = 0; i < V; ++i) {
    if (s[i] >= t) best.offer(race_key(s[i], stream, i), i);
  }
  return {best.index, kept_weight(s[best.index], m, t) / z, kStatusOk};
}

}  // namespace

void unmask_positions_cpu(const UnmaskArgs& a, int64_t begin, int64_t end) {
  std::vector<float> s(static_cast<size_t>(a.vocab));
  for (int64_t flat = begin; flat < end; ++flat) {
    const int64_t b = flat / a.width, w = flat % a.width;
    Decided d{-1, -INFINITY, kStatusOk};
    if (!bad_row_params(a, b) && is_masked(a, b, w)) d = decide(a, b, w, s);
    a.sampled[flat] = d.token;
    a.confidence[flat] = d.confidence;
    a.position_status[flat] = d.status;
  }
}

void unmask_select_cpu(const UnmaskArgs& a, int64_t begin, int64_t end) {
  for (int64_t b = begin; b < end; ++b) {
    int32_t status = bad_row_params(a, b) ? int32_t{kStatusBadSamplingParams} : int32_t{kStatusOk};
    for (int64_t w = 0; w < a.width && status == kStatusOk; ++w) {
      status = a.position_status[b * a.width + w];
    }
    for (int64_t w = 0; w < a.width; ++w) a.keep[b * a.width + w] = keep_position(a, b, w, status);
    if (status != kStatusOk) {  // a flagged row reports nothing it drew
      for (int64_t w = 0; w < a.width; ++w) {
        a.sampled[b * a.width + w] = -1;
        a.confidence[b * a.width + w] = -INFINITY;
      }
    }
    a.status[b] = status;
  }
}

}  // namespace diffusion
}  // namespace specdec
