// One unmasking step of masked-diffusion generation (LLaDA low-confidence remasking, Fast-dLLM's
// threshold rule), shared by the CPU and CUDA kernels: the argument block, the per-element math of
// one masked position's distribution, the threshold searches and the per-row selection.
//
// Layout (B rows, a window of W positions, vocab V):
//
//   logits [B, W, V]   element (b, w, i) at b * stride_b + w * stride_w + i (vocab contiguous)
//   tokens [B, W]      the current tokens; tokens == mask_id marks the masked positions
//        |
//        |  step 1, per (b, w) masked:  s_i = float(l_i) / T, top-k / top-p threshold t,
//        |          x = argmax_{s_i >= t} s_i + G_i       (Gumbel race; greedy argmax when T = 0)
//        |          confidence = p(x) = exp(s_x - m) / sum_{s_i >= t} exp(s_i - m)
//        v          (T = 0: p(x) of softmax(l), the probability of the greedy token)
//   sampled [B, W], confidence [B, W]  (-1 / -inf at unmasked positions)
//        |
//        |  step 2, per row b: rank the masked positions by confidence (ties to the lower w) and
//        v          keep the num_transfer[b] best (top-n), or every one with confidence >=
//                   threshold[b] plus the best one (threshold rule, when threshold[b] > 0)
//   keep [B, W] (uint8 0 / 1), status [B]
//
// Random draws: Philox stream (seed[b], position[b] + w, kPurposeDiffusion, substream = step[b]),
// element i for vocab entry i: every step of every position draws fresh numbers, and a row's
// draws depend neither on its batch neighbours nor on the device. Temperature / top-k / top-p mean
// exactly what they mean for `sample` (python/specdec_cuda/reference/sampling.py).
//
// Statuses (kernels/common/status.h): 3 when temperature < 0 or NaN, top_p outside (0, 1], a NaN
// threshold, or a negative num_transfer under the top-n rule; 1 when a masked position's logits
// hold NaN / +inf (after the temperature) or only -inf. A flagged row keeps nothing and reports
// sampled -1, confidence -inf everywhere.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/hd.h"
#include "kernels/common/philox.h"
#include "kernels/common/status.h"
#include "kernels/sampling/distribution.h"

namespace specdec {
namespace diffusion {

struct UnmaskArgs {
  const void* logits;  // [batch, width, vocab] of `dtype`, strides below (elements)
  DType dtype;
  int64_t batch;
  int64_t width;
  int64_t vocab;
  int64_t stride_b;  // logits stride between rows
  int64_t stride_w;  // logits stride between positions
  const int64_t* tokens;  // [batch, width] contiguous; == mask_id where masked
  int64_t mask_id;
  // per-row parameters, each [batch]
  const float* temperature;     // 0: greedy
  const int32_t* top_k;         // <= 0 or >= vocab: off
  const float* top_p;           // 1: off
  const int64_t* seed;
  const int64_t* position;      // absolute position of window column 0
  const int64_t* step;          // substream of this step's draws, in [0, 2^24)
  const int64_t* num_transfer;  // top-n rule: how many masked positions to keep
  const float* threshold;       // > 0: threshold rule instead of top-n
  // outputs
  int64_t* sampled;           // [batch, width]: the drawn token, -1 where not masked or flagged
  float* confidence;          // [batch, width]: p(sampled), -inf where not masked or flagged
  uint8_t* keep;              // [batch, width]: 1 where the position is unmasked this step
  int32_t* status;            // [batch]
  int32_t* position_status;   // [batch, width] workspace: step 1's status per position
};

// Row parameters a position checks before reading logits (status 3).
SPECDEC_HD bool bad_row_params(const UnmaskArgs& a, int64_t b) {
  const float t = a.temperature[b], p = a.top_p[b], th = a.threshold[b];
  if (!(t >= 0.0f) || !(p > 0.0f && p <= 1.0f)) return true;
  if (th != th) return true;
  if (!(th > 0.0f) && a.num_transfer[b] < 0) return true;
  return false;
}

SPECDEC_HD bool is_masked(const UnmaskArgs& a, int64_t b, int64_t w) {
  return a.tokens[b * a.width + w] == a.mask_id;
}

// float32 logit i of position (b, w).
SPECDEC_HD float logit_at(const UnmaskArgs& a, int64_t b, int64_t w, int64_t i) {
  const int64_t off = b * a.stride_b + w * a.stride_w + i;
  switch (a.dtype) {
    case DType::kFloat16: return to_float(static_cast<const Half16*>(a.logits)[off]);
    case DType::kBFloat16: return to_float(static_cast<const BFloat16*>(a.logits)[off]);
    case DType::kFloat64: return to_float(static_cast<const double*>(a.logits)[off]);
    case DType::kFloat32:
    default: return static_cast<const float*>(a.logits)[off];
  }
}

// A scaled logit's contribution to the softmax mass under threshold t: exp(s - m), 0 if removed.
SPECDEC_HD float kept_weight(float s, float m, float t) {
  return s >= t ? sampling::exp_nonpos(s - m) : 0.0f;
}

// Largest order key K with f(K) satisfied, where f is monotone (true for small K, false for large):
// a bisection over the 32 bits of the key, MSB first. Used for the k-th largest value (f(K) =
// count(key_i >= K) >= k) and the top-p cut (f(K) = mass(key_i >= K) >= top_p): the largest such K
// is always the key of an element, so float_from_order_key(K) is that element's value exactly.
template <class Pred>
SPECDEC_HD uint32_t largest_key_where(Pred&& pred) {
  uint32_t key = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t trial = key | (uint32_t{1} << bit);
    if (pred(trial)) key = trial;
  }
  return key;
}

// Gumbel race key of element i (distribution.h's noise on the position's stream).
SPECDEC_HD float race_key(float s, const RandomStream& stream, int64_t i) {
  return s + sampling::gumbel_noise(stream.element(static_cast<uint32_t>(i)));
}

SPECDEC_HD RandomStream position_stream(const UnmaskArgs& a, int64_t b, int64_t w) {
  return RandomStream(static_cast<uint64_t>(a.seed[b]), a.position[b] + w, kPurposeDiffusion,
                      static_cast<uint32_t>(a.step[b]));
}

// Step 2 for position w of row b: whether it is kept. `first_bad` is the row's status (0 or the
// first flagged position's); the rank is the number of masked positions that beat w (a higher
// confidence, or an equal one at a lower index). O(width) per position, O(width^2) per row: the
// window is one block of a few dozen positions.
SPECDEC_HD bool keep_position(const UnmaskArgs& a, int64_t b, int64_t w, int32_t row_status) {
  if (row_status != kStatusOk || !is_masked(a, b, w)) return false;
  const float* conf = a.confidence + b * a.width;
  const float c = conf[w];
  int64_t rank = 0;
  for (int64_t j = 0; j < a.width; ++j) {
    if (j == w || !is_masked(a, b, j)) continue;
    if (conf[j] > c || (conf[j] == c && j < w)) ++rank;
  }
  const float th = a.threshold[b];
  if (th > 0.0f) return rank == 0 || c >= th;
  return rank < a.num_transfer[b];
}

}  // namespace diffusion
}  // namespace specdec
