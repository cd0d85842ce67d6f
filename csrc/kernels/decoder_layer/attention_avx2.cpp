// The decoder layer's AVX2 attention (see attention_avx2.h).
#include "kernels/decoder_layer/attention_avx2.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>
#include <vector>

#include "kernels/common/cpu_isa.h"
#include "kernels/common/exp_avx2.h"

namespace specdec::layer {

#if defined(__x86_64__)
namespace {

#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))

// Sum of 8 lanes in a fixed order: halves, then pairs, then the last two.
SPECDEC_AVX2 inline float reduce_add(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

SPECDEC_AVX2 inline float reduce_max(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, 1)));
}

// q · k over C 8-float chunks: one fma chain, then reduce_add's fixed tree.
template <int C>
SPECDEC_AVX2 inline float dot(const float* q, const float* k) {
  __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q), _mm256_loadu_ps(k));
  for (int c = 1; c < C; ++c) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * c), _mm256_loadu_ps(k + 8 * c), acc);
  return reduce_add(acc);
}

// All-ones in the first `count` lanes (count < 8), for maskload / maskstore of a tail.
SPECDEC_AVX2 inline __m256i first_lanes(int64_t count) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(count)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// scores[0 .. count) -> exp(score - max) in place; returns their sum (lane r % 8 partial sums).
SPECDEC_AVX2 float softmax_numerators(float* scores, int64_t count) {
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  __m256 top = neg_inf;
  int64_t r = 0;
  for (; r + 8 <= count; r += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(scores + r));
  const __m256i tail = first_lanes(count - r);
  if (r < count) top = _mm256_max_ps(top, _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(scores + r, tail),
                                                          _mm256_castsi256_ps(tail)));
  const __m256 max = _mm256_set1_ps(reduce_max(top));
  __m256 total = _mm256_setzero_ps();
  for (r = 0; r + 8 <= count; r += 8) {
    const __m256 p = exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(scores + r), max));
    _mm256_storeu_ps(scores + r, p);
    total = _mm256_add_ps(total, p);
  }
  if (r < count) {
    const __m256 p = _mm256_and_ps(exp8_avx2(_mm256_sub_ps(_mm256_maskload_ps(scores + r, tail), max)),
                                   _mm256_castsi256_ps(tail));
    _mm256_maskstore_ps(scores + r, tail, p);
    total = _mm256_add_ps(total, p);
  }
  return reduce_add(total);
}

// out_u = sum_r p_u[r] v_slot(r) / total_u for TILE queries u: the shared prefix slots first (each
// value row read once per tile, from L1 for the tile's other queries), then each query's own
// visible new slots. Registers: TILE * C accumulators + TILE broadcasts (values are fma operands).
template <int C, int TILE>
SPECDEC_AVX2 void weighted_values(const float* values, int64_t len, const float* const* p,
                                  const int64_t* const* new_slots, const int64_t* new_counts, const float* totals,
                                  float* const* out) {
  __m256 acc[TILE][C];
  for (int u = 0; u < TILE; ++u)
    for (int c = 0; c < C; ++c) acc[u][c] = _mm256_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    const float* v = values + t * 8 * C;
    for (int u = 0; u < TILE; ++u) {
      const __m256 pb = _mm256_broadcast_ss(p[u] + t);
      for (int c = 0; c < C; ++c) acc[u][c] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(v + 8 * c), acc[u][c]);
    }
  }
  for (int u = 0; u < TILE; ++u) {
    for (int64_t r = 0; r < new_counts[u]; ++r) {
      const float* v = values + new_slots[u][r] * 8 * C;
      const __m256 pb = _mm256_broadcast_ss(p[u] + len + r);
      for (int c = 0; c < C; ++c) acc[u][c] = _mm256_fmadd_ps(pb, _mm256_loadu_ps(v + 8 * c), acc[u][c]);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / totals[u]);
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(out[u] + 8 * c, _mm256_mul_ps(acc[u][c], inv));
  }
}

// Queries per pass over the values: TILE * (C + 1) <= 16 ymm registers where it can be (one
// accumulator set spills a little past C = 15).
template <int C>
constexpr int kTile = C <= 3 ? 4 : C <= 4 ? 3 : C <= 7 ? 2 : 1;

template <int C>
SPECDEC_AVX2 void attend_items(const float* qkv, const float* k_cache, const float* v_cache, const int64_t* lengths,
                               const bool* tree_mask, float sm_scale, const AttentionShape& s, float* out,
                               int64_t begin, int64_t end) {
  constexpr int64_t D = 8 * C;
  constexpr int TILE = kTile<C>;
  const int64_t width = (s.Hq + 2 * s.Hkv) * D, group = s.Hq / s.Hkv, n = s.n;
  // Scratch, reused across calls: scores [n][slots] (then the softmax numerators), and each
  // query's visible new slots [n][n] with their counts.
  thread_local std::vector<float> scores;
  thread_local std::vector<int64_t> new_slots, new_counts;
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / s.Hq, h = item % s.Hq, g = h / group;
    const float* keys = k_cache + (b * s.Hkv + g) * s.T * D;
    const float* values = v_cache + (b * s.Hkv + g) * s.T * D;
    const int64_t len = lengths[b], stride = len + n;
    scores.resize(n * stride);
    new_slots.resize(n * n);
    new_counts.resize(n);
    auto query = [&](int64_t i) { return qkv + (b * n + i) * width + h * D; };
    // The committed prefix: each key row serves all n queries while it is in L1.
    for (int64_t t = 0; t < len; ++t)
      for (int64_t i = 0; i < n; ++i) scores[i * stride + t] = dot<C>(query(i), keys + t * D) * sm_scale;
    for (int64_t i = 0; i < n; ++i) {
      int64_t count = 0;
      for (int64_t j = 0; j < n; ++j) {
        const bool sees = j == i || (tree_mask == nullptr ? j < i : tree_mask[(b * n + i) * n + j]);
        if (!sees) continue;
        const int64_t slot = len + j;
        scores[i * stride + len + count] = dot<C>(query(i), keys + slot * D) * sm_scale;
        new_slots[i * n + count++] = slot;
      }
      new_counts[i] = count;
    }
    for (int64_t i0 = 0; i0 < n; i0 += TILE) {
      const int tile = static_cast<int>(std::min<int64_t>(TILE, n - i0));
      const float* p[TILE];
      const int64_t* slots[TILE];
      int64_t counts[TILE];
      float totals[TILE];
      float* dst[TILE];
      for (int u = 0; u < tile; ++u) {
        const int64_t i = i0 + u;
        float* row = scores.data() + i * stride;
        totals[u] = softmax_numerators(row, len + new_counts[i]);
        p[u] = row;
        slots[u] = new_slots.data() + i * n;
        counts[u] = new_counts[i];
        dst[u] = out + (b * n + i) * s.Hq * D + h * D;
      }
      switch (tile) {
        case 1: weighted_values<C, 1>(values, len, p, slots, counts, totals, dst); break;
        case 2: weighted_values<C, std::min(2, TILE)>(values, len, p, slots, counts, totals, dst); break;
        case 3: weighted_values<C, std::min(3, TILE)>(values, len, p, slots, counts, totals, dst); break;
        default: weighted_values<C, TILE>(values, len, p, slots, counts, totals, dst); break;
      }
    }
  }
}

// AVX2 where the CPU has it and neither SPECDEC_CPU_ISA nor a wider tier takes its place.
const bool kAvx2 = cpu_avx2_is_widest();

using ItemsFn = void (*)(const float*, const float*, const float*, const int64_t*, const bool*, float,
                         const AttentionShape&, float*, int64_t, int64_t);

template <int... Cs>
constexpr auto items_table(std::integer_sequence<int, Cs...>) {
  return std::array<ItemsFn, sizeof...(Cs)>{&attend_items<Cs + 1>...};
}

// attend_items<C> for C = 1 .. 16 (head dims 8 .. 128).
constexpr auto kItems = items_table(std::make_integer_sequence<int, 16>{});

}  // namespace

bool attend_avx2_supports(int64_t D) { return kAvx2 && D % 8 == 0 && D >= 8 && D <= 128; }

void attend_avx2(const float* qkv, const float* k_cache, const float* v_cache, const int64_t* lengths,
                 const bool* tree_mask, float sm_scale, const AttentionShape& s, float* out, int64_t begin,
                 int64_t end) {
  kItems[s.D / 8 - 1](qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
}

#else
bool attend_avx2_supports(int64_t) { return false; }
void attend_avx2(const float*, const float*, const float*, const int64_t*, const bool*, float, const AttentionShape&,
                 float*, int64_t, int64_t) {}
#endif

}  // namespace specdec::layer
