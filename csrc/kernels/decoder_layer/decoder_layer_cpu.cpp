// The decoder layer's row kernels (see decoder_layer_cpu.h). Each is written once as an inline
// body with explicit 16-lane partial sums (so the compiler vectorises it without reassociating
// floating-point sums) and compiled three times: for baseline x86-64 and, picked at run time, for
// AVX-512 or AVX2 + FMA (SPECDEC_CPU_ISA caps the choice, as for the other CPU kernels). Two are
// hand-vectorised on both wider tiers instead, because libm's scalar expf dominated them:
// attention (attention_avx512.h, attention_avx2.h) and SiLU. Each tier's bits differ from the
// others' within float32 rounding; each still gives a row the same bits whatever the other rows are.
#include "kernels/decoder_layer/decoder_layer_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
// GCC 12's AVX-512 headers trip these on the masked and reduce intrinsics' undefined operands.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "kernels/common/cpu_isa.h"
#include "kernels/common/exp_avx2.h"
#include "kernels/common/exp_avx512.h"
#include "kernels/decoder_layer/attention_avx2.h"
#include "kernels/decoder_layer/attention_avx512.h"

#define SPECDEC_INLINE inline __attribute__((always_inline))

namespace specdec::layer {
namespace {

constexpr int kLanes = 16;

// sum_k a[k] * b[k]: 16 partial sums over k in order (lane k % 16), then a pairwise reduction.
SPECDEC_INLINE float dot(const float* a, const float* b, int64_t K) {
  float part[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= K; k += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += a[k + j] * b[k + j];
  for (int j = 0; k + j < K; ++j) part[j] += a[k + j] * b[k + j];
  for (int width = kLanes / 2; width >= 1; width /= 2)
    for (int j = 0; j < width; ++j) part[j] += part[j + width];
  return part[0];
}

SPECDEC_INLINE void rms_norm_row(const float* x, const float* weight, float eps, int64_t H, float* out) {
  const float inv = 1.0f / std::sqrt(dot(x, x, H) / static_cast<float>(H) + eps);
  for (int64_t k = 0; k < H; ++k) out[k] = x[k] * inv * weight[k];
}

SPECDEC_INLINE void rms_norm_rows_body(const float* x, const float* weight, float eps, int64_t M, int64_t H,
                                       float* out) {
  for (int64_t m = 0; m < M; ++m) rms_norm_row(x + m * H, weight, eps, H, out + m * H);
}

// One head in place: optional RMSNorm over D, then RoPE (needs a D-float scratch).
SPECDEC_INLINE void norm_rope_head(float* head, const float* norm, float eps, const float* cos, const float* sin,
                                   int64_t D, float* scratch) {
  if (norm != nullptr) rms_norm_row(head, norm, eps, D, head);
  const int64_t half = D / 2;
  for (int64_t d = 0; d < D; ++d) scratch[d] = head[d] * cos[d] + head[d < half ? d + half : d - half] * sin[d];
  std::memcpy(head, scratch, sizeof(float) * D);
}

SPECDEC_INLINE void rope_and_store_body(float* qkv, const float* cos, const float* sin, const float* q_norm,
                                        const float* k_norm, float eps, float* k_cache, float* v_cache,
                                        const int64_t* lengths, const AttentionShape& s) {
  const int64_t width = (s.Hq + 2 * s.Hkv) * s.D;
  std::vector<float> scratch(s.D);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t m = b * s.n + i, slot = lengths[b] + i;
      float* row = qkv + m * width;
      for (int64_t h = 0; h < s.Hq + s.Hkv; ++h)
        norm_rope_head(row + h * s.D, h < s.Hq ? q_norm : k_norm, eps, cos + m * s.D, sin + m * s.D, s.D,
                       scratch.data());
      for (int64_t g = 0; g < s.Hkv; ++g) {
        const int64_t at = ((b * s.Hkv + g) * s.T + slot) * s.D;
        std::memcpy(k_cache + at, row + (s.Hq + g) * s.D, sizeof(float) * s.D);
        std::memcpy(v_cache + at, row + (s.Hq + s.Hkv + g) * s.D, sizeof(float) * s.D);
      }
    }
}

SPECDEC_INLINE bool visible(const bool* tree_mask, int64_t n, int64_t b, int64_t i, int64_t j) {
  // j: new-token index of a slot (slot - lengths[b]); committed slots have j < 0.
  if (j < 0 || j == i) return true;
  return tree_mask == nullptr ? j < i : tree_mask[(b * n + i) * n + j];
}

// Two passes over the visible slots: scores and their maximum, then exp, sum and the weighted sum
// of values in slot order.
SPECDEC_INLINE void attend_body(const float* qkv, const float* k_cache, const float* v_cache,
                                const int64_t* lengths, const bool* tree_mask, float sm_scale,
                                const AttentionShape& s, float* out, int64_t begin, int64_t end) {
  const int64_t width = (s.Hq + 2 * s.Hkv) * s.D, group = s.Hq / s.Hkv;
  std::vector<float> scores, acc(s.D);
  for (int64_t item = begin; item < end; ++item) {
    const int64_t b = item / s.Hq, h = item % s.Hq, g = h / group;
    const float* keys = k_cache + (b * s.Hkv + g) * s.T * s.D;
    const float* values = v_cache + (b * s.Hkv + g) * s.T * s.D;
    const int64_t len = lengths[b], slots = len + s.n;
    scores.resize(slots);
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t m = b * s.n + i;
      const float* q = qkv + m * width + h * s.D;
      float top = -INFINITY;
      for (int64_t t = 0; t < slots; ++t) {
        if (!visible(tree_mask, s.n, b, i, t - len)) continue;
        scores[t] = dot(q, keys + t * s.D, s.D) * sm_scale;
        top = std::max(top, scores[t]);
      }
      float total = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t t = 0; t < slots; ++t) {
        if (!visible(tree_mask, s.n, b, i, t - len)) continue;
        const float p = std::exp(scores[t] - top);
        total += p;
        const float* v = values + t * s.D;
        for (int64_t d = 0; d < s.D; ++d) acc[d] += p * v[d];
      }
      float* o = out + m * s.Hq * s.D + h * s.D;
      const float inv = 1.0f / total;
      for (int64_t d = 0; d < s.D; ++d) o[d] = acc[d] * inv;
    }
  }
}

SPECDEC_INLINE void silu_mul_body(const float* gate_up, int64_t M, int64_t I, float* act) {
  for (int64_t m = 0; m < M; ++m) {
    const float* gate = gate_up + m * 2 * I;
    const float* up = gate + I;
    for (int64_t j = 0; j < I; ++j) act[m * I + j] = gate[j] / (1.0f + std::exp(-gate[j])) * up[j];
  }
}

#if defined(__x86_64__)
#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512dq,fma")))
SPECDEC_AVX512 void rms_norm_rows_avx512(const float* x, const float* w, float eps, int64_t M, int64_t H, float* o) {
  rms_norm_rows_body(x, w, eps, M, H, o);
}
SPECDEC_AVX512 void rope_and_store_avx512(float* qkv, const float* cos, const float* sin, const float* qn,
                                          const float* kn, float eps, float* kc, float* vc, const int64_t* lengths,
                                          const AttentionShape& s) {
  rope_and_store_body(qkv, cos, sin, qn, kn, eps, kc, vc, lengths, s);
}
// Head dims the vector attention (attention_avx512.h) does not take.
SPECDEC_AVX512 void attend_loop_avx512(const float* qkv, const float* kc, const float* vc, const int64_t* lengths,
                                       const bool* tree_mask, float scale, const AttentionShape& s, float* out,
                                       int64_t begin, int64_t end) {
  attend_body(qkv, kc, vc, lengths, tree_mask, scale, s, out, begin, end);
}
// silu(g) * u = g / (1 + e^-g) * u, 16 lanes at a time with the vector exp; the tail masked.
SPECDEC_AVX512 void silu_mul_avx512(const float* gate_up, int64_t M, int64_t I, float* act) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t m = 0; m < M; ++m) {
    const float* gate = gate_up + m * 2 * I;
    const float* up = gate + I;
    for (int64_t j = 0; j < I; j += 16) {
      const __mmask16 mask = static_cast<__mmask16>(I - j >= 16 ? 0xFFFF : (1u << (I - j)) - 1u);
      const __m512 g = _mm512_maskz_loadu_ps(mask, gate + j);
      const __m512 e = exp16_avx512(_mm512_sub_ps(_mm512_setzero_ps(), g));
      const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
      _mm512_mask_storeu_ps(act + m * I + j, mask, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(mask, up + j)));
    }
  }
}

#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))
SPECDEC_AVX2 void rms_norm_rows_avx2(const float* x, const float* w, float eps, int64_t M, int64_t H, float* o) {
  rms_norm_rows_body(x, w, eps, M, H, o);
}
SPECDEC_AVX2 void rope_and_store_avx2(float* qkv, const float* cos, const float* sin, const float* qn,
                                      const float* kn, float eps, float* kc, float* vc, const int64_t* lengths,
                                      const AttentionShape& s) {
  rope_and_store_body(qkv, cos, sin, qn, kn, eps, kc, vc, lengths, s);
}
// Head dims the AVX2 attention (attention_avx2.h) does not take.
SPECDEC_AVX2 void attend_loop_avx2(const float* qkv, const float* kc, const float* vc, const int64_t* lengths,
                                   const bool* tree_mask, float scale, const AttentionShape& s, float* out,
                                   int64_t begin, int64_t end) {
  attend_body(qkv, kc, vc, lengths, tree_mask, scale, s, out, begin, end);
}
// silu(g) * u as in silu_mul_avx512, 8 lanes at a time; a tail of under 8 goes through a padded
// block, so each element gets the same operations wherever it lies.
SPECDEC_AVX2 inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 e = exp8_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}
SPECDEC_AVX2 void silu_mul_avx2(const float* gate_up, int64_t M, int64_t I, float* act) {
  for (int64_t m = 0; m < M; ++m) {
    const float* gate = gate_up + m * 2 * I;
    const float* up = gate + I;
    int64_t j = 0;
    for (; j + 8 <= I; j += 8)
      _mm256_storeu_ps(act + m * I + j, silu_mul8(_mm256_loadu_ps(gate + j), _mm256_loadu_ps(up + j)));
    if (j < I) {
      alignas(32) float g[8] = {}, u[8] = {}, a[8];
      std::copy(gate + j, gate + I, g);
      std::copy(up + j, up + I, u);
      _mm256_store_ps(a, silu_mul8(_mm256_load_ps(g), _mm256_load_ps(u)));
      std::copy(a, a + (I - j), act + m * I + j);
    }
  }
}

// The widest tier SPECDEC_CPU_ISA allows on this CPU (kernels/common/cpu_isa.h).
const bool kAvx512 = cpu_avx512_fma_enabled();
const bool kAvx2 = cpu_avx2_is_widest();
#else
const bool kAvx512 = false;
const bool kAvx2 = false;
#endif

}  // namespace

void rms_norm_rows(const float* x, const float* weight, float eps, int64_t M, int64_t H, float* out) {
#if defined(__x86_64__)
  if (kAvx512) return rms_norm_rows_avx512(x, weight, eps, M, H, out);
  if (kAvx2) return rms_norm_rows_avx2(x, weight, eps, M, H, out);
#endif
  rms_norm_rows_body(x, weight, eps, M, H, out);
}

void rope_and_store(float* qkv, const float* cos, const float* signed_sin, const float* q_norm,
                    const float* k_norm, float eps, float* k_cache, float* v_cache, const int64_t* lengths,
                    const AttentionShape& s) {
#if defined(__x86_64__)
  if (kAvx512) return rope_and_store_avx512(qkv, cos, signed_sin, q_norm, k_norm, eps, k_cache, v_cache, lengths, s);
  if (kAvx2) return rope_and_store_avx2(qkv, cos, signed_sin, q_norm, k_norm, eps, k_cache, v_cache, lengths, s);
#endif
  rope_and_store_body(qkv, cos, signed_sin, q_norm, k_norm, eps, k_cache, v_cache, lengths, s);
}

void attend(const float* qkv, const float* k_cache, const float* v_cache, const int64_t* lengths,
            const bool* tree_mask, float sm_scale, const AttentionShape& s, float* out, int64_t begin,
            int64_t end) {
#if defined(__x86_64__)
  if (attend_avx512_supports(s.D))
    return attend_avx512(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
  if (kAvx512) return attend_loop_avx512(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
  if (attend_avx2_supports(s.D))
    return attend_avx2(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
  if (kAvx2) return attend_loop_avx2(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
#endif
  attend_body(qkv, k_cache, v_cache, lengths, tree_mask, sm_scale, s, out, begin, end);
}

void silu_mul_rows(const float* gate_up, int64_t M, int64_t I, float* act) {
#if defined(__x86_64__)
  if (kAvx512) return silu_mul_avx512(gate_up, M, I, act);
  if (kAvx2) return silu_mul_avx2(gate_up, M, I, act);
#endif
  silu_mul_body(gate_up, M, I, act);
}

}  // namespace specdec::layer
