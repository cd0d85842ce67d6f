// Argument blocks of the sampling family's kernels (torch-free; CPU and CUDA share them).
//
// verify_chain's ragged layout: row i owns drafts draft_tokens[cu[i] .. cu[i+1]) (k_i of them), the
// target logit rows cu[i] + i .. cu[i+1] + i (k_i + 1 rows: one per draft position plus the bonus
// position) and, when present, draft logit rows cu[i] .. cu[i+1]. Position j of row i is the
// absolute position position[i] + j, which keys its random streams.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/hd.h"
#include "kernels/common/status.h"

namespace specdec {
namespace sampling {

// Per-row sampling parameters, each a [rows] array.
struct RowParams {
  const float* temperature;  // 0: greedy; < 0 or NaN: kStatusBadSamplingParams
  const int32_t* top_k;      // <= 0 or >= vocab: off
  const float* top_p;        // 1: off; outside (0, 1]: kStatusBadSamplingParams
  const int64_t* seed;
  const int64_t* position;   // absolute position of the row's first token
};

// How a row of verify_chain decides (fixed per row by its parameters).
enum RowKind : int32_t {
  kKindGreedy = 0,     // temperature 0: accept while draft == argmax
  kKindTypical = 1,    // typical acceptance (lossy, opt-in)
  kKindMatch = 2,      // no draft logits: sample from p, accept while it equals the draft
  kKindRejection = 3,  // draft logits: accept with min(1, p/q), residual on rejection
};

struct SampleArgs {
  const void* logits;  // [rows, vocab] of `dtype`, row stride `logits_stride` elements
  DType dtype;
  int64_t rows;
  int64_t vocab;
  int64_t logits_stride;
  RowParams params;
  uint32_t purpose;
  uint32_t substream;
  int64_t* tokens;  // [rows]
  int32_t* status;  // [rows]
};

struct VerifyArgs {
  const int64_t* draft_tokens;  // [num_drafts]
  const int64_t* cu_num_draft;  // [batch + 1]
  const void* target_logits;    // [num_drafts + batch, vocab], row stride target_stride
  const void* draft_logits;     // [num_drafts, vocab], row stride draft_stride, or nullptr
  DType dtype;                  // of both logit tensors
  int64_t batch;
  int64_t num_drafts;
  int64_t vocab;
  int64_t target_stride;
  int64_t draft_stride;
  RowParams params;
  bool typical;
  double typical_epsilon;
  double typical_alpha;
  int64_t max_draft;       // width of the outputs: tokens [batch, max_draft + 1]
  int64_t* tokens;         // [batch, max_draft + 1], -1 padded
  int64_t* num_accepted;   // [batch]
  int8_t* accepted;        // [batch, max_draft]: 1 accepted, 0 rejected, -1 not reached
  int32_t* status;         // [batch]
};

// What one position of one row decided; the walk over positions turns these into outputs.
struct PositionResult {
  int64_t token;   // the emitted token at this position (the draft when accepted)
  int32_t status;  // kStatusOk, or kStatusNonFiniteLogits when a logit row read here was unusable
  int32_t accepted;  // 1 when the draft at this position is accepted
};

SPECDEC_HD RowKind row_kind(float temperature, bool typical, bool has_draft_logits) {
  if (temperature == 0.0f) return kKindGreedy;
  if (typical) return kKindTypical;
  return has_draft_logits ? kKindRejection : kKindMatch;
}

// kStatusBadSamplingParams: temperature < 0 or NaN, top_p outside (0, 1] (NaN fails every comparison).
SPECDEC_HD bool bad_params(float temperature, float top_p) {
  return !(temperature >= 0.0f) || !(top_p > 0.0f && top_p <= 1.0f);
}

// The largest row r with cu[r] + r <= t (-1 when none), by binary search. For a valid cu this is
// the row owning target logit row t; for any cu it is non-decreasing in t (each comparison is), which
// row_layout_ok relies on. Written as cu[r] <= t - r so that a huge cu entry cannot overflow.
SPECDEC_HD int64_t target_owner(const VerifyArgs& a, int64_t t) {
  int64_t lo = 0, hi = a.batch - 1, found = -1;
  while (lo <= hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (a.cu_num_draft[mid] <= t - mid) {
      found = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  return found;
}

// Whether row i's draft layout is readable: offsets inside [0, num_drafts] (each checked before the
// difference is taken), non-decreasing, no more drafts than the output width, and its target rows
// owned by no other row (both ends map back to it, hence every row between: target_owner is
// monotone), so a parallel evaluation never hands it another row's results when cu is not
// monotone. A row failing this is flagged like an out-of-range draft.
SPECDEC_HD bool row_layout_ok(const VerifyArgs& a, int64_t row) {
  const int64_t lo = a.cu_num_draft[row], hi = a.cu_num_draft[row + 1];
  if (!(lo >= 0 && hi >= lo && hi <= a.num_drafts && hi - lo <= a.max_draft)) return false;
  return target_owner(a, lo + row) == row && target_owner(a, hi + row) == row;
}

}  // namespace sampling
}  // namespace specdec

namespace specdec {
namespace sampling {

// Row-level checks that come before any logit is read, in the reference's order: parameters
// (kStatusBadSamplingParams), then the draft layout and every draft token's range
// (kStatusDraftTokenOutOfRange). Returns kStatusOk or the code.
SPECDEC_HD int32_t verify_row_precheck(const VerifyArgs& a, int64_t row) {
  if (bad_params(a.params.temperature[row], a.params.top_p[row])) return kStatusBadSamplingParams;
  if (!row_layout_ok(a, row)) return kStatusDraftTokenOutOfRange;
  for (int64_t d = a.cu_num_draft[row]; d < a.cu_num_draft[row + 1]; ++d) {
    if (a.draft_tokens[d] < 0 || a.draft_tokens[d] >= a.vocab) return kStatusDraftTokenOutOfRange;
  }
  return kStatusOk;
}

// The walk over one row's positions (serial on both devices): writes tokens / accepted /
// num_accepted / status of row `row`. `evaluate(j)` returns the PositionResult of position j; it is
// called for j = 0, 1, ... and never past the first rejection, flagged position or the bonus. On
// CUDA every thread of a block may walk together (evaluate being block-collective, so control flow
// stays uniform) with only `writer` storing the outputs.
template <class Evaluate>
SPECDEC_HD void walk_row(const VerifyArgs& a, int64_t row, Evaluate&& evaluate, bool writer = true) {
  const int64_t width = a.max_draft + 1;
  int64_t* tokens = a.tokens + row * width;
  int8_t* accepted = a.accepted + row * a.max_draft;
  int64_t emitted = 0;    // tokens written so far
  int64_t reached = 0;    // draft positions decided (accepted entries written)
  int64_t num_acc = 0;
  int32_t status = verify_row_precheck(a, row);
  if (status == kStatusOk) {
    const int64_t k = a.cu_num_draft[row + 1] - a.cu_num_draft[row];
    for (int64_t j = 0; j <= k; ++j) {
      const PositionResult r = evaluate(j);
      if (r.status != kStatusOk) {
        status = r.status;
        emitted = 0;
        reached = 0;
        num_acc = 0;
        break;
      }
      if (writer) tokens[j] = r.token;
      if (writer && j < k) accepted[j] = r.accepted ? 1 : 0;
      emitted = j + 1;
      if (j < k) reached = j + 1;
      if (j == k || !r.accepted) {
        num_acc = j;
        break;
      }
    }
  }
  if (!writer) return;
  // a flagged row emits nothing; padding: tokens -1 past what was emitted, accepted -1 past the
  // positions reached (emitted positions are reached; the bonus has no accepted entry)
  for (int64_t j = emitted; j < width; ++j) tokens[j] = -1;
  for (int64_t j = reached; j < a.max_draft; ++j) accepted[j] = -1;
  a.num_accepted[row] = num_acc;
  a.status[row] = status;
}

}  // namespace sampling
}  // namespace specdec
