// The decoder layer's AVX-512 attention (see attention_avx512.h).
#include "kernels/decoder_layer/attention_avx512.h"

#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__)
// GCC 12's AVX-512 headers trip these on the masked and reduce intrinsics' undefined operands.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "kernels/common/cpu_isa.h"
#include "kernels/common/exp_avx512.h"

namespace specdec::layer {

#if defined(__x86_64__)
namespace {

#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512dq,fma")))

// q · k over C 16-float chunks: one fma chain, then _mm512_reduce_add_ps's fixed tree.
template <int C>
SPECDEC_AVX512 inline float dot(const float* q, const float* k) {
  __m512 acc = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k));
  for (int c = 1; c < C; ++c) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * c), _mm512_loadu_ps(k + 16 * c), acc);
  return _mm512_reduce_add_ps(acc);
}

// scores[0 .. count) -> exp(score - max) in place; returns their sum (lane r % 16 partial sums).
SPECDEC_AVX512 float softmax_numerators(float* scores, int64_t count) {
  __m512 top = _mm512_set1_ps(-INFINITY);
  for (int64_t r = 0; r < count; r += 16) {
    const __mmask16 m = static_cast<__mmask16>(count - r >= 16 ? 0xFFFF : (1u << (count - r)) - 1u);
    top = _mm512_max_ps(top, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, scores + r));
  }
  const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(top));
  __m512 total = _mm512_setzero_ps();
  for (int64_t r = 0; r < count; r += 16) {
    const __mmask16 m = static_cast<__mmask16>(count - r >= 16 ? 0xFFFF : (1u << (count - r)) - 1u);
    const __m512 p = exp16_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, scores + r), max));
    _mm512_mask_storeu_ps(scores + r, m, p);
    total = _mm512_add_ps(total, _mm512_maskz_mov_ps(m, p));
  }
  return _mm512_reduce_add_ps(total);
}

// out_u = sum_r p_u[r] v_slot(r) / total_u for TILE queries u: the shared prefix slots first (each
// value row loaded once for the tile), then each query's own visible new slots.
template <int C, int TILE>
SPECDEC_AVX512 void weighted_values(const float* values, int64_t len, const float* const* p,
                                    const int64_t* const* new_slots, const int64_t* new_counts,
                                    const float* totals, float* const* out) {
  __m512 acc[TILE][C];
  for (int u = 0; u < TILE; ++u)
    for (int c = 0; c < C; ++c) acc[u][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    const float* v = values + t * 16 * C;
    __m512 vc[C];
    for (int c = 0; c < C; ++c) vc[c] = _mm512_loadu_ps(v + 16 * c);
    for (int u = 0; u < TILE; ++u) {
      const __m512 pb = _mm512_set1_ps(p[u][t]);
      for (int c = 0; c < C; ++c) acc[u][c] = _mm512_fmadd_ps(pb, vc[c], acc[u][c]);
    }
  }
  for (int u = 0; u < TILE; ++u) {
    for (int64_t r = 0; r < new_counts[u]; ++r) {
      const float* v = values + new_slots[u][r] * 16 * C;
      const __m512 pb = _mm512_set1_ps(p[u][len + r]);
      for (int c = 0; c < C; ++c) acc[u][c] = _mm512_fmadd_ps(pb, _mm512_loadu_ps(v + 16 * c), acc[u][c]);
    }
    const __m512 inv = _mm512_set1_ps(1.0f / totals[u]);
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out[u] + 16 * c, _mm512_mul_ps(acc[u][c], inv));
  }
}

// Queries per pass over the values: TILE * C accumulators plus C value registers stay in the 32 zmm.
template <int C>
constexpr int kTile = C <= 4 ? 4 : 2;

template <int C>
SPECDEC_AVX512 void attend_items(const float* qkv, const float* k_cache, const float* v_cache,
                                 const int64_t* lengths, const bool* tree_mask, float sm_scale,
                                 const AttentionShape& s, float* out, int64_t begin, int64_t end) {
  constexpr int64_t D = 16 * C;
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
    // The committed prefix: every query sees every slot; each key row is used by all n queries
    // while it is in L1, so the prefix streams from L2 once per item.
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
        case 2: weighted_values<C, 2>(values, len, p, slots, counts, totals, dst); break;
        case 3: weighted_values<C, std::min(3, TILE)>(values, len, p, slots, counts, totals, dst); break;
        default: weighted_values<C, TILE>(values, len, p, slots, counts, totals, dst); break;
      }
    }
  }
}

const bool kAvx512 = cpu_avx512_fma_enabled();

}  // namespace

bool attend_avx512_supports(int64_t D) { return kAvx512 && D % 16 == 0 && D >= 16 && D <= 128; }

void attend_avx512(const float* qkv, const float* k_cache, const float* v_cache, const int64_t* lengths,
                   const bool* tree_mask, float sm_scale, const AttentionShape& s, float* out, int64_t begin,
                   int64_t end) {
  switch (s.D / 16) {
    case 1: return attend_items<1>(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
    case 2: return attend_items<2>(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
    case 3: return attend_items<3>(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
    case 4: return attend_items<4>(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
    case 5: return attend_items<5>(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
    case 6: return attend_items<6>(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
    case 7: return attend_items<7>(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
    case 8: return attend_items<8>(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
  }
}

#else
bool attend_avx512_supports(int64_t) { return false; }
void attend_avx512(const float*, const float*, const float*, const int64_t*, const bool*, float,
                   const AttentionShape&, float*, int64_t, int64_t) {}
#endif

}  // namespace specdec::layer
