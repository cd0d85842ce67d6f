// CPU kernels of `sample` and `verify_chain` (torch-free).
//
// Per logit row the work is a few streaming passes over a float buffer of the scaled row s (decoded
// once from fp32 / fp16 / bf16, L2-resident at V = 128k):
//   scan_row      max and NaN / +inf flags                       (vectorised)
//   kth_largest   top-k threshold: 12-bit histogram of order keys, then nth_element in one bucket
//   sum_exp       Z = sum exp(s - m) and sum exp(s - m)(s - m)     (vectorised, polynomial exp)
//   nucleus       top-p threshold: probability mass histogram of order keys, then one sorted bucket
//   race          Gumbel race with exact pruning (distribution.h): Philox only for candidates
//   residual      max(0, p - q) into a buffer (vectorised), then the pruned residual race
// The vectorised loops are compiled three times (AVX-512, AVX2+FMA, baseline x86-64) and picked at
// load time (GCC target_clones), since a default build targets baseline x86-64.
#include "kernels/sampling/sampling_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/common/philox.h"
#include "kernels/common/status.h"
#include "kernels/sampling/distribution.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SPECDEC_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SPECDEC_SIMD_CLONES
#endif

namespace specdec {
namespace sampling {
namespace {

// ---- vectorised passes -------------------------------------------------------------------------

SPECDEC_SIMD_CLONES void decode_f32(const float* in, int64_t n, float temperature, float* s) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) s[i] = in[i] / temperature;
}

SPECDEC_SIMD_CLONES void decode_bf16(const uint16_t* in, int64_t n, float temperature, float* s) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) s[i] = bits_to_float(static_cast<uint32_t>(in[i]) << 16) / temperature;
}

SPECDEC_SIMD_CLONES void decode_f16(const uint16_t* in, int64_t n, float temperature, float* s) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) s[i] = to_float(Half16{in[i]}) / temperature;
}

void decode_f64(const double* in, int64_t n, float temperature, float* s) {
  for (int64_t i = 0; i < n; ++i) s[i] = static_cast<float>(in[i]) / temperature;
}

// s = float(row) / temperature (temperature 1 for greedy: the division is then exact).
void decode_row(const void* base, DType dtype, int64_t row, int64_t stride, int64_t vocab,
                float temperature, float* s) {
  switch (dtype) {
    case DType::kFloat32:
      decode_f32(static_cast<const float*>(base) + row * stride, vocab, temperature, s);
      break;
    case DType::kFloat16:
      decode_f16(static_cast<const uint16_t*>(base) + row * stride, vocab, temperature, s);
      break;
    case DType::kBFloat16:
      decode_bf16(static_cast<const uint16_t*>(base) + row * stride, vocab, temperature, s);
      break;
    case DType::kFloat64:
      decode_f64(static_cast<const double*>(base) + row * stride, vocab, temperature, s);
      break;
  }
}

struct RowScan {
  float max;
  bool bad;  // NaN or +inf somewhere
};

SPECDEC_SIMD_CLONES RowScan scan_row(const float* s, int64_t n) {
  float m = -INFINITY;
  int bad = 0;
#pragma omp simd reduction(max : m) reduction(| : bad)
  for (int64_t i = 0; i < n; ++i) {
    const float x = s[i];
    m = x > m ? x : m;  // NaN never wins the comparison
    bad |= static_cast<int>(x != x) | static_cast<int>(x == INFINITY);
  }
  return {m, bad != 0};
}

// Z = sum_{s >= threshold} exp(s - m) and dot = sum exp(s - m) (s - m).
SPECDEC_SIMD_CLONES void sum_exp(const float* s, int64_t n, float m, float threshold, float* z_out,
                                 float* dot_out) {
  float z = 0.0f, dot = 0.0f;
#pragma omp simd reduction(+ : z, dot)
  for (int64_t i = 0; i < n; ++i) {
    const float x = s[i];
    const float d = x - m;
    const float e = x >= threshold ? exp_nonpos(d) : 0.0f;
    z += e;
    dot += e > 0.0f ? e * d : 0.0f;
  }
  *z_out = z;
  *dot_out = dot;
}

// r_i = max(0, p_i - q_i) (or p_i itself when `use_p`); returns max_i r_i.
SPECDEC_SIMD_CLONES float residual_fill(const float* st, const float* sq, int64_t n, float mt,
                                        float tht, float izt, float mq, float thq, float izq,
                                        bool use_p, float* r) {
  float rmax = 0.0f;
#pragma omp simd reduction(max : rmax)
  for (int64_t i = 0; i < n; ++i) {
    const float p = st[i] >= tht ? exp_nonpos(st[i] - mt) * izt : 0.0f;
    const float q = sq[i] >= thq ? exp_nonpos(sq[i] - mq) * izq : 0.0f;
    const float d = use_p ? p : p - q;
    const float v = d > 0.0f ? d : 0.0f;
    r[i] = v;
    rmax = v > rmax ? v : rmax;
  }
  return rmax;
}

int64_t first_index_of(const float* s, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) {
    if (s[i] == value) return i;
  }
  return 0;
}

// ---- thresholds ---------------------------------------------------------------------------------

constexpr int kBucketBits = 12;  // sign + 8 exponent + 3 mantissa bits of the order key
constexpr int kBuckets = 1 << kBucketBits;

SPECDEC_HD uint32_t bucket_of(float x) { return float_order_key(x) >> (32 - kBucketBits); }

// The k-th largest value of s (no NaN), as torch.topk(s, k).values[-1].
float kth_largest(const float* s, int64_t n, int64_t k, std::vector<float>& subset) {
  std::vector<int64_t> count(kBuckets, 0);
  for (int64_t i = 0; i < n; ++i) ++count[bucket_of(s[i])];
  int64_t above = 0;
  int bucket = kBuckets - 1;
  for (; bucket > 0; --bucket) {
    if (above + count[bucket] >= k) break;
    above += count[bucket];
  }
  subset.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<int>(bucket_of(s[i])) == bucket) subset.push_back(s[i]);
  }
  const int64_t rank = k - above - 1;  // 0-based rank inside the bucket, largest first
  std::nth_element(subset.begin(), subset.begin() + rank, subset.end(), std::greater<float>());
  return subset[rank];
}

// Top-p threshold: the largest value t of s with float(P(s >= t)) >= top_p under p_i =
// exp(s_i - m) * inv_z over s_i >= threshold (the top-k filtered softmax); the mass is accumulated in
// double as torch.cumsum does on CPU. Returns -inf when rounding leaves the total below top_p.
float nucleus_threshold(const float* s, int64_t n, float threshold, float m, float inv_z,
                        float top_p, std::vector<float>& subset) {
  std::vector<double> mass(kBuckets, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (s[i] >= threshold) mass[bucket_of(s[i])] += exp_nonpos(s[i] - m) * inv_z;
  }
  double above = 0.0;
  int bucket = kBuckets - 1;
  for (; bucket >= 0; --bucket) {
    if (static_cast<float>(above + mass[bucket]) >= top_p) break;
    above += mass[bucket];
  }
  if (bucket < 0) return -INFINITY;
  subset.clear();
  for (int64_t i = 0; i < n; ++i) {
    if (s[i] >= threshold && static_cast<int>(bucket_of(s[i])) == bucket) subset.push_back(s[i]);
  }
  std::sort(subset.begin(), subset.end(), std::greater<float>());
  double cum = above;
  for (const float x : subset) {
    cum += exp_nonpos(x - m) * inv_z;
    if (static_cast<float>(cum) >= top_p) return x;
  }
  return subset.empty() ? -INFINITY : subset.back();
}

// ---- distributions and races -------------------------------------------------------------------

struct DistCpu {
  float max;        // m
  float threshold;  // keep s >= threshold
  float inv_z;      // 1 / Z over what is kept (only when built with probabilities)
  float entropy;
};

// Statistics of the scaled row s under top-k / top-p. Returns false when the row is unusable.
// With need_probs false and top-p off, Z and the entropy are skipped (a race needs neither).
bool build_dist(const float* s, int64_t vocab, int32_t top_k, float top_p, bool need_probs,
                DistCpu& d, std::vector<float>& subset) {
  const RowScan scan = scan_row(s, vocab);
  if (row_unusable(scan.bad, scan.max)) return false;
  d.max = scan.max;
  d.threshold = -INFINITY;
  d.inv_z = 0.0f;
  d.entropy = 0.0f;
  if (top_k > 0 && top_k < vocab) d.threshold = kth_largest(s, vocab, top_k, subset);
  if (!need_probs && top_p >= 1.0f) return true;
  float z, dot;
  sum_exp(s, vocab, d.max, d.threshold, &z, &dot);
  if (top_p < 1.0f) {
    const float t = nucleus_threshold(s, vocab, d.threshold, d.max, 1.0f / z, top_p, subset);
    if (t > d.threshold) {
      d.threshold = t;
      sum_exp(s, vocab, d.max, d.threshold, &z, &dot);
    }
  }
  d.inv_z = 1.0f / z;
  d.entropy = logf(z) - dot / z;
  return true;
}

float prob_of(const float* s, const DistCpu& d, int64_t x) {
  return s[x] >= d.threshold ? exp_nonpos(s[x] - d.max) * d.inv_z : 0.0f;
}

// Philox draws of one stream, computing each block of four once.
struct CachedStream {
  const RandomStream& stream;
  uint32_t block = 0xffffffffu;
  PhiloxOut bits{};
  uint32_t operator()(int64_t i) {
    const uint32_t b = static_cast<uint32_t>(i >> 2);
    if (b != block) {
      bits = stream.block(b);
      block = b;
    }
    return bits.x[i & 3];
  }
};

// argmax_i s_i + G_i over s_i >= threshold (distribution.h), pruned exactly.
int64_t race(const float* s, int64_t n, const DistCpu& d, const RandomStream& stream) {
  CachedStream draw{stream};
  const int64_t first = first_index_of(s, n, d.max);  // highest bound: start the pruning there
  RaceBest best{s[first] + gumbel_noise(draw(first)), first};
  for (int64_t i = 0; i < n; ++i) {
    const float x = s[i];
    if (x >= d.threshold && x + kGumbelMax >= best.key && i != first) {
      best.offer(x + gumbel_noise(draw(i)), i);
    }
  }
  return best.index;
}

// argmax_i r_i / E_i over r_i > 0 (r from residual_fill with max rmax > 0), pruned exactly.
int64_t residual_race(const float* r, int64_t n, float rmax, const RandomStream& stream) {
  CachedStream draw{stream};
  const int64_t first = first_index_of(r, n, rmax);
  RaceBest best{r[first] / exp_noise(draw(first)), first};
  for (int64_t i = 0; i < n; ++i) {
    const float x = r[i];
    if (x > 0.0f && x * kInvExpNoiseMin >= best.key && i != first) {
      best.offer(x / exp_noise(draw(i)), i);
    }
  }
  return best.index;
}

// Scratch of one worker: scaled target row, scaled draft row, residual / subset buffers.
struct Workspace {
  std::vector<float> target, draft, residual, subset;
  explicit Workspace(int64_t vocab) : target(vocab), draft(vocab), residual(vocab) {}
};

// Greedy: first argmax of the raw logits; false when the row is unusable.
bool greedy_token(const void* base, DType dtype, int64_t row, int64_t stride, int64_t vocab,
                  float* s, int64_t& token) {
  decode_row(base, dtype, row, stride, vocab, 1.0f, s);
  const RowScan scan = scan_row(s, vocab);
  if (row_unusable(scan.bad, scan.max)) return false;
  token = first_index_of(s, vocab, scan.max);
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

  decode_row(a.target_logits, a.dtype, target_row, a.target_stride, a.vocab, temperature, st);
  const bool need_probs = x >= 0 && (kind == kKindTypical || kind == kKindRejection);
  DistCpu dt;
  if (!build_dist(st, a.vocab, p.top_k[row], p.top_p[row], need_probs, dt, ws.subset)) {
    return unusable();
  }
  const RandomStream sample_stream(seed, pos, kPurposeSample, 0);
  if (x < 0 || kind == kKindMatch) {  // bonus token, or sample-and-match
    const int64_t y = race(st, a.vocab, dt, sample_stream);
    return {y, kStatusOk, y == x ? 1 : 0};
  }
  const float p_x = prob_of(st, dt, x);
  if (kind == kKindTypical) {
    if (accept_typical(p_x, dt.entropy, a.typical_epsilon, a.typical_alpha)) return {x, kStatusOk, 1};
    return {race(st, a.vocab, dt, sample_stream), kStatusOk, 0};
  }
  // Rejection sampling against the draft's distribution q at the same position.
  float* sq = ws.draft.data();
  decode_row(a.draft_logits, a.dtype, lo + j, a.draft_stride, a.vocab, temperature, sq);
  DistCpu dq;
  if (!build_dist(sq, a.vocab, p.top_k[row], p.top_p[row], true, dq, ws.subset)) return unusable();
  const float q_x = prob_of(sq, dq, x);
  const float u = uniform_open01(RandomStream(seed, pos, kPurposeAccept, 0).element(0));
  if (accept_draft(u, q_x, p_x)) return {x, kStatusOk, 1};
  float* r = ws.residual.data();
  float rmax = residual_fill(st, sq, a.vocab, dt.max, dt.threshold, dt.inv_z, dq.max, dq.threshold,
                             dq.inv_z, false, r);
  if (!(rmax > 0.0f)) {  // p <= q everywhere: the defined outcome is a sample from p
    rmax = residual_fill(st, sq, a.vocab, dt.max, dt.threshold, dt.inv_z, dq.max, dq.threshold,
                         dq.inv_z, true, r);
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
      decode_row(a.logits, a.dtype, row, a.logits_stride, a.vocab, temperature, s.data());
      DistCpu d;
      ok = build_dist(s.data(), a.vocab, a.params.top_k[row], a.params.top_p[row], false, d, subset);
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
