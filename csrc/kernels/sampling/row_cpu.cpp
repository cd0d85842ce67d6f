// CPU passes over one decoded logit row (row_cpu.h), used by sample, verify_chain and verify_tree.
//
// Per row the work is a few streaming passes over the float buffer s (L2-resident at V = 128k):
//   scan_row      max and NaN / +inf flags                                  (vectorised)
//   kth_largest   top-k threshold: filter.h's radix select; the first round histograms the whole
//                 row, later rounds only the candidates the previous one left
//   sum_exp       Z = sum exp(s - m) and sum exp(s - m)(s - m)              (vectorised)
//   nucleus       top-p threshold: the same radix select over probability mass
//   race          Gumbel race with exact pruning (distribution.h): Philox only for candidates
//   residual      max(0, p - q) into a buffer (vectorised), then the pruned residual race
// The vectorised loops are compiled three times (AVX-512, AVX2+FMA, baseline x86-64) and picked at
// load time (GCC target_clones), since a default build targets baseline x86-64.
#include "kernels/sampling/row_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/sampling/distribution.h"

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SPECDEC_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SPECDEC_SIMD_CLONES
#endif

namespace specdec {
namespace sampling {
namespace cpu {
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

SPECDEC_SIMD_CLONES float residual_fill_simd(const float* st, const float* sq, int64_t n, float mt,
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

SPECDEC_SIMD_CLONES RowScan scan_row_simd(const float* s, int64_t n) {
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

// ---- thresholds (filter.h) ----------------------------------------------------------------------

// Keeps the candidates whose current digit is d: the first round gathers them from the row into
// `cand`, later rounds filter `cand` in place.
template <class Keep>
void narrow(const float* xs, int64_t len, std::vector<float>& cand, Keep&& keep) {
  if (xs != cand.data()) {
    cand.clear();
    for (int64_t i = 0; i < len; ++i)
      if (keep(xs[i])) cand.push_back(xs[i]);
    return;
  }
  size_t out = 0;
  for (int64_t i = 0; i < len; ++i)
    if (keep(xs[i])) cand[out++] = xs[i];
  cand.resize(out);
}

// The k-th largest value of s (no NaN), as torch.topk(s, k).values[-1].
float kth_largest(const float* s, int64_t n, int64_t k, std::vector<float>& cand) {
  RadixPrefix rp;
  int64_t remaining = k;
  int64_t count[kRadixBuckets];
  const float* xs = s;
  int64_t len = n;
  for (int round = 0; round < kRadixRounds; ++round) {
    std::fill(count, count + kRadixBuckets, int64_t{0});
    for (int64_t i = 0; i < len; ++i) ++count[rp.digit(float_order_key(xs[i]))];
    const uint32_t d = pick_count_digit(count, remaining);
    if (round + 1 < kRadixRounds) {
      narrow(xs, len, cand, [&](float x) { return rp.digit(float_order_key(x)) == d; });
      xs = cand.data();
      len = static_cast<int64_t>(cand.size());
    }
    rp.descend(d);
  }
  return rp.value();
}

// Top-p threshold over p_i = exp(s_i - m) * inv_z for s_i >= threshold (the top-k filtered
// softmax); -inf when rounding leaves the total below top_p.
float nucleus_threshold(const float* s, int64_t n, float threshold, float m, float inv_z,
                        float top_p, std::vector<float>& cand) {
  RadixPrefix rp;
  double above = 0.0;
  double mass[kRadixBuckets];
  const float* xs = s;
  int64_t len = n;
  for (int round = 0; round < kRadixRounds; ++round) {
    std::fill(mass, mass + kRadixBuckets, 0.0);
    for (int64_t i = 0; i < len; ++i) {
      const float x = xs[i];
      if (x >= threshold) mass[rp.digit(float_order_key(x))] += exp_nonpos(x - m) * inv_z;
    }
    const int d = pick_mass_digit(mass, above, top_p, rp.first_round());
    if (d < 0) return -INFINITY;
    if (round + 1 < kRadixRounds) {
      narrow(xs, len, cand, [&](float x) {
        return x >= threshold && rp.digit(float_order_key(x)) == static_cast<uint32_t>(d);
      });
      xs = cand.data();
      len = static_cast<int64_t>(cand.size());
    }
    rp.descend(static_cast<uint32_t>(d));
  }
  return rp.value();
}

// ---- races --------------------------------------------------------------------------------------

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

// The race in tiles of kTile elements: a tile none of whose elements may win (distribution.h) is
// skipped without drawing; otherwise its Philox draws and Gumbel keys are computed together
// (vectorised), then offered in index order. Same winner as evaluating every element, since a
// skipped element cannot win or tie.
constexpr int64_t kTile = 64;

SPECDEC_SIMD_CLONES void gumbel_keys(const RandomStream& stream, int64_t first, const float* s,
                                     float* keys) {
  uint32_t bits[kTile];
  const uint32_t first_block = static_cast<uint32_t>(first >> 2);
#pragma omp simd
  for (int b = 0; b < kTile / 4; ++b) {
    const PhiloxOut o = philox4x32_10(first_block + static_cast<uint32_t>(b), stream.c1, stream.c2,
                                      stream.c3, stream.k0, stream.k1);
    bits[4 * b] = o.x[0];
    bits[4 * b + 1] = o.x[1];
    bits[4 * b + 2] = o.x[2];
    bits[4 * b + 3] = o.x[3];
  }
#pragma omp simd
  for (int i = 0; i < kTile; ++i) keys[i] = gumbel_key(s[i], bits[i]);
}

// Offers the kept elements of the tile starting at `base` (keys computed together, vectorised).
void race_tile(const float* s, int64_t n, int64_t base, const RowDist& d,
               const RandomStream& stream, RaceBest& best) {
  const int64_t len = n - base < kTile ? n - base : kTile;
  float padded[kTile];
  float keys[kTile];
  const float* tile = s + base;
  if (len < kTile) {  // the last, partial tile: pad so the vector loop stays fixed-length
    for (int64_t i = 0; i < kTile; ++i) padded[i] = i < len ? s[base + i] : -INFINITY;
    tile = padded;
  }
  gumbel_keys(stream, base, tile, keys);
  for (int64_t i = 0; i < len; ++i) {
    if (kept(d, tile[i]) && tile[i] > -INFINITY) best.offer(keys[i], base + i);
  }
}

}  // namespace

// ---- the interface ------------------------------------------------------------------------------

const void* offset_pointer(const void* base, DType dtype, int64_t elements) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<const float*>(base) + elements;
    case DType::kFloat16:
    case DType::kBFloat16: return static_cast<const uint16_t*>(base) + elements;
    case DType::kFloat64: return static_cast<const double*>(base) + elements;
  }
  return base;
}

void decode_row(const void* row, DType dtype, int64_t vocab, float temperature, float* s) {
  switch (dtype) {
    case DType::kFloat32: return decode_f32(static_cast<const float*>(row), vocab, temperature, s);
    case DType::kFloat16:
      return decode_f16(static_cast<const uint16_t*>(row), vocab, temperature, s);
    case DType::kBFloat16:
      return decode_bf16(static_cast<const uint16_t*>(row), vocab, temperature, s);
    case DType::kFloat64: return decode_f64(static_cast<const double*>(row), vocab, temperature, s);
  }
}

RowScan scan_row(const float* s, int64_t n) { return scan_row_simd(s, n); }

int64_t first_index_of(const float* s, int64_t n, float value) {
  for (int64_t i = 0; i < n; ++i) {
    if (s[i] == value) return i;
  }
  return 0;
}

bool build_dist(const float* s, int64_t vocab, int64_t top_k, float top_p, bool need_probs,
                RowDist& d, float* entropy, std::vector<float>& scratch) {
  const RowScan scan = scan_row(s, vocab);
  if (row_unusable(scan.bad, scan.max)) return false;
  d.max = scan.max;
  d.threshold = -INFINITY;
  d.inv_z = 0.0f;
  if (entropy != nullptr) *entropy = 0.0f;
  if (top_k_active(top_k, vocab)) d.threshold = kth_largest(s, vocab, top_k, scratch);
  if (!need_probs && !top_p_active(top_p)) return true;
  float z, dot;
  sum_exp(s, vocab, d.max, d.threshold, &z, &dot);
  if (top_p_active(top_p)) {
    const float t = nucleus_threshold(s, vocab, d.threshold, d.max, 1.0f / z, top_p, scratch);
    if (t > d.threshold) {
      d.threshold = t;
      sum_exp(s, vocab, d.max, d.threshold, &z, &dot);
    }
  }
  d.inv_z = 1.0f / z;
  if (entropy != nullptr) *entropy = logf(z) - dot / z;
  return true;
}

int64_t race(const float* s, int64_t n, const RowDist& d, const RandomStream& stream) {
  // start with the tile of the first maximum (the highest bound), so pruning is tight at once
  const int64_t first_tile = first_index_of(s, n, d.max) / kTile * kTile;
  RaceBest best{-INFINITY, n};
  race_tile(s, n, first_tile, d, stream, best);
  for (int64_t base = 0; base < n; base += kTile) {
    if (base == first_tile) continue;
    const int64_t len = n - base < kTile ? n - base : kTile;
    float tile_max = -INFINITY;
    for (int64_t i = 0; i < len; ++i) tile_max = s[base + i] > tile_max ? s[base + i] : tile_max;
    if (kept(d, tile_max) && gumbel_may_win(tile_max, best.key)) {
      race_tile(s, n, base, d, stream, best);
    }
  }
  return best.index;
}

int64_t residual_race(const float* r, int64_t n, float rmax, const RandomStream& stream) {
  CachedStream draw{stream};
  const int64_t first = first_index_of(r, n, rmax);
  RaceBest best{residual_key(r[first], draw(first)), first};
  for (int64_t i = 0; i < n; ++i) {
    if (i != first && residual_may_win(r[i], best.key)) best.offer(residual_key(r[i], draw(i)), i);
  }
  return best.index;
}

float residual_fill(const float* st, const RowDist& dt, const float* sq, const RowDist& dq,
                    int64_t n, bool use_p, float* r) {
  return residual_fill_simd(st, sq, n, dt.max, dt.threshold, dt.inv_z, dq.max, dq.threshold,
                            dq.inv_z, use_p, r);
}

}  // namespace cpu
}  // namespace sampling
}  // namespace specdec
