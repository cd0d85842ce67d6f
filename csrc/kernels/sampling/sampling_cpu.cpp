// CPU kernels of `sample` and `verify_chain` (torch-free): the decisions of reference/sampling.py,
// position by position, on top of the shared row passes of row_cpu.h (decode, filter, races), which
// verify_tree's CPU kernel uses as well.
#include "kernels/sampling/sampling_cpu.h"

#include <cmath>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/common/philox.h"
#include "kernels/common/status.h"
#include "kernels/sampling/distribution.h"
#include "kernels/sampling/filter.h"
#include "kernels/sampling/row_cpu.h"

namespace specdec {
namespace sampling {
namespace {

using cpu::build_dist;
using cpu::decode_row;
using cpu::race;
using cpu::residual_fill;
using cpu::residual_race;
using cpu::offset_pointer;

// Scratch of one worker: scaled target row, scaled draft row, residual / candidate buffers.
struct Workspace {
  std::vector<float> target, draft, residual, subset;
  explicit Workspace(int64_t vocab) : target(vocab), draft(vocab), residual(vocab) {}
};

// Greedy: first argmax of the raw logits; false when the row is unusable.
bool greedy_token(const void* base, DType dtype, int64_t row, int64_t stride, int64_t vocab,
                  float* s, int64_t& token) {
  decode_row(offset_pointer(base, dtype, row * stride), dtype, vocab, 1.0f, s);
  const cpu::RowScan scan = cpu::scan_row(s, vocab);
  if (row_unusable(scan.bad, scan.max)) return false;
  token = cpu::first_index_of(s, vocab, scan.max);
  return true;
}

PositionResult unusable() { return {-1, kStatusNonFiniteLogits, 0}; }

// The decision at position j of row `row` (precheck passed): see reference/sampling.py _verify_row.
PositionResult evaluate_position(const VerifyArgs& a, int64_t row, int64_t j, Workspace& ws) {
  const RowParams& p = a.params;
  const int64_t lo = a.cu_num_draft[row];
  const int64_t k = a.cu_num_draft[row + 1] - lo;
  const int64_t target_row = lo + row + j;
  const int64_t x = j < k ? a.draft_tokens[lo + j] : -1;
  const int64_t pos = p.position[row] + j;
  const uint64_t seed = static_cast<uint64_t>(p.seed[row]);
  const float temperature = p.temperature[row];
  const RowKind kind = row_kind(temperature, a.typical, a.draft_logits != nullptr);
  float* st = ws.target.data();

  if (kind == kKindGreedy) {
    int64_t best;
    if (!greedy_token(a.target_logits, a.dtype, target_row, a.target_stride, a.vocab, st, best)) {
      return unusable();
    }
    return {best, kStatusOk, x == best ? 1 : 0};
  }

  decode_row(offset_pointer(a.target_logits, a.dtype, target_row * a.target_stride), a.dtype,
             a.vocab, temperature, st);
  const bool need_probs = x >= 0 && (kind == kKindTypical || kind == kKindRejection);
  RowDist dt;
  float entropy;
  if (!build_dist(st, a.vocab, p.top_k[row], p.top_p[row], need_probs, dt, &entropy, ws.subset)) {
    return unusable();
  }
  const RandomStream sample_stream(seed, pos, kPurposeSample, 0);
  if (x < 0 || kind == kKindMatch) {  // bonus token, or sample-and-match
    const int64_t y = race(st, a.vocab, dt, sample_stream);
    return {y, kStatusOk, y == x ? 1 : 0};
  }
  const float p_x = prob(dt, st[x]);
  if (kind == kKindTypical) {
    if (accept_typical(p_x, entropy, a.typical_epsilon, a.typical_alpha)) return {x, kStatusOk, 1};
    return {race(st, a.vocab, dt, sample_stream), kStatusOk, 0};
  }
  // Rejection sampling against the draft's distribution q at the same position.
  float* sq = ws.draft.data();
  decode_row(offset_pointer(a.draft_logits, a.dtype, (lo + j) * a.draft_stride), a.dtype,
             a.vocab, temperature, sq);
  RowDist dq;
  if (!build_dist(sq, a.vocab, p.top_k[row], p.top_p[row], true, dq, nullptr, ws.subset)) {
    return unusable();
  }
  const float q_x = prob(dq, sq[x]);
  const float u = uniform_open01(RandomStream(seed, pos, kPurposeAccept, 0).element(0));
  if (accept_draft(u, q_x, p_x)) return {x, kStatusOk, 1};
  float* r = ws.residual.data();
  float rmax = residual_fill(st, dt, sq, dq, a.vocab, false, r);
  if (!(rmax > 0.0f)) {  // p <= q everywhere: the defined outcome is a sample from p
    rmax = residual_fill(st, dt, sq, dq, a.vocab, true, r);
  }
  const RandomStream residual_stream(seed, pos, kPurposeResidual, 0);
  return {residual_race(r, a.vocab, rmax, residual_stream), kStatusOk, 0};
}

}  // namespace

void sample_cpu(const SampleArgs& a, int64_t begin, int64_t end) {
  std::vector<float> s(a.vocab), subset;
  for (int64_t row = begin; row < end; ++row) {
    a.tokens[row] = -1;
    const float temperature = a.params.temperature[row];
    if (bad_params(temperature, a.params.top_p[row])) {
      a.status[row] = kStatusBadSamplingParams;
      continue;
    }
    int64_t token = -1;
    bool ok;
    if (temperature == 0.0f) {
      ok = greedy_token(a.logits, a.dtype, row, a.logits_stride, a.vocab, s.data(), token);
    } else {
      decode_row(offset_pointer(a.logits, a.dtype, row * a.logits_stride), a.dtype, a.vocab,
                 temperature, s.data());
      RowDist d;
      ok = build_dist(s.data(), a.vocab, a.params.top_k[row], a.params.top_p[row], false, d,
                      nullptr, subset);
      if (ok) {
        const RandomStream stream(static_cast<uint64_t>(a.params.seed[row]),
                                  a.params.position[row], a.purpose, a.substream);
        token = race(s.data(), a.vocab, d, stream);
      }
    }
    a.tokens[row] = ok ? token : -1;
    a.status[row] = ok ? kStatusOk : kStatusNonFiniteLogits;
  }
}

void verify_chain_serial_cpu(const VerifyArgs& a, int64_t begin, int64_t end) {
  Workspace ws(a.vocab);
  for (int64_t row = begin; row < end; ++row) {
    walk_row(a, row, [&](int64_t j) { return evaluate_position(a, row, j, ws); });
  }
}

void verify_chain_positions_cpu(const VerifyArgs& a, const int64_t* row_of_target, int64_t begin,
                                int64_t end, PositionResult* results) {
  Workspace ws(a.vocab);
  for (int64_t t = begin; t < end; ++t) {
    const int64_t row = row_of_target[t];
    results[t] = {-1, kStatusOk, 0};
    if (row < 0 || verify_row_precheck(a, row) != 0) continue;  // the walk flags the row
    results[t] = evaluate_position(a, row, t - a.cu_num_draft[row] - row, ws);
  }
}

void verify_chain_walk_cpu(const VerifyArgs& a, const PositionResult* results, int64_t begin,
                           int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    const PositionResult* mine = results + (row_layout_ok(a, row) ? a.cu_num_draft[row] + row : 0);
    walk_row(a, row, [&](int64_t j) { return mine[j]; });
  }
}

}  // namespace sampling
}  // namespace specdec
