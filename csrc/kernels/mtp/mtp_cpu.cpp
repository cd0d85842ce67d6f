// CPU MTP-head kernels (see mtp_cpu.h). The LM-head read of a row-major float32 / bf16 head goes
// through the skinny-linear kernel, that of a packed head through the packed-panel kernel (both
// pick AVX-512 at run time); the other dot products are `omp simd` reductions compiled for
// AVX-512, AVX2 and baseline x86-64 and picked at load time (target_clones): the default build
// targets baseline x86-64, and these loops are bound by reading lm_head / eh_proj.
#include "kernels/mtp/mtp_cpu.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/common/cpu_isa.h"
#include "kernels/common/dtype.h"
#include "kernels/common/exp_avx2.h"
#include "kernels/mtp/topk.h"
#include "kernels/quant/w4_cpu.h"
#include "kernels/skinny_linear/packed_cpu.h"
#include "kernels/skinny_linear/skinny_linear_cpu.h"

namespace specdec::mtp {
namespace {

#if defined(__x86_64__) && !defined(__clang__)
#define SPECDEC_MTP_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SPECDEC_MTP_CLONES
#endif

// <a, b> with a in float and b a float / bf16 row: 4 independent partial sums per lane group
// via the simd reduction (the order differs from BLAS; callers compare with a tolerance).
SPECDEC_MTP_CLONES float dot_f32(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

SPECDEC_MTP_CLONES float dot_bf16(const float* a, const uint16_t* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * bits_to_float(static_cast<uint32_t>(b[i]) << 16);
  return s;
}

template <typename T>
double load(T v) {
  if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return to_float(v);
  }
}

template <typename T, typename Acc>
Acc dot(const Acc* a, const T* b, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    return dot_f32(a, b, n);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return dot_bf16(a, reinterpret_cast<const uint16_t*>(b), n);
  } else {
    Acc s = 0;
    for (int64_t i = 0; i < n; ++i) s += a[i] * static_cast<Acc>(load(b[i]));
    return s;
  }
}

template <typename T, typename Acc>
void normalize_row(const T* x, const T* weight, double eps, int64_t H, Acc* out) {
  Acc ss = 0;
  for (int64_t i = 0; i < H; ++i) {
    const Acc v = static_cast<Acc>(load(x[i]));
    ss += v * v;
  }
  const Acc r = Acc(1) / std::sqrt(ss / static_cast<Acc>(H) + static_cast<Acc>(eps));
  for (int64_t i = 0; i < H; ++i) out[i] = static_cast<Acc>(load(x[i])) * r * static_cast<Acc>(load(weight[i]));
}

}  // namespace

template <typename T, typename Acc>
void rms_normalize_rows(const T* x, const T* weight, double eps, int64_t M, int64_t H, Acc* xn) {
  for (int64_t m = 0; m < M; ++m) normalize_row(x + m * H, weight, eps, H, xn + m * H);
}

template <typename T, typename Acc>
void head_topk_range(const Acc* xn, int64_t M, int64_t H, const T* lm_head, int64_t V,
                     int64_t v_begin, int64_t v_end, int k, Acc* vals, int64_t* idx, int* n,
                     uint8_t* nonfinite, Acc* logits) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, BFloat16>) {
    // float32 / bf16 heads: the skinny-linear kernel streams kChunk vocabulary rows at a time
    // (each read once for up to 8 activation rows, AVX-512 where the CPU has it) into scratch
    // [M, kChunk], then the epilogue. The logits never leave this scratch unless asked for.
    constexpr int64_t kChunk = 64;
    std::vector<float> scratch(static_cast<size_t>(M * kChunk));
    for (int64_t v0 = v_begin; v0 < v_end; v0 += kChunk) {
      const int64_t width = std::min(kChunk, v_end - v0);
      if constexpr (std::is_same_v<T, float>) {
        skinny::skinny_linear_cpu_rows(xn, M, H, lm_head + v0 * H, nullptr, scratch.data(), width, 0, width);
      } else {
        skinny::skinny_linear_cpu_rows_bf16(xn, M, H, reinterpret_cast<const uint16_t*>(lm_head + v0 * H),
                                            nullptr, scratch.data(), width, 0, width);
      }
      rank_logits_block(scratch.data(), M, width, v0, V, k, vals, idx, n, nonfinite, logits);
    }
  } else {
    for (int64_t v = v_begin; v < v_end; ++v) {
      const T* w = lm_head + v * H;
      for (int64_t m = 0; m < M; ++m) {
        const Acc z = dot<T, Acc>(xn + m * H, w, H);
        if (!std::isfinite(z)) nonfinite[m] = 1;
        if (logits != nullptr) logits[m * V + v] = z;
        topk_insert(vals + m * k, idx + m * k, k, n[m], z, v);
      }
    }
  }
}

namespace {

// One row's scores z [width] (ids v0 ..) into its running top-k: every score through topk_insert.
void rank_row_scalar(const float* z, int64_t width, int64_t v0, int k, float* vals, int64_t* idx, int& n,
                     uint8_t& nonfinite) {
  for (int64_t j = 0; j < width; ++j) {
    if (!std::isfinite(z[j])) nonfinite = 1;
    topk_insert(vals, idx, k, n, z[j], v0 + j);
  }
}

#if defined(__x86_64__)
// The same list, 8 scores at a time: a lane goes to topk_insert only when the list is not full,
// the score is above the list's last value (a later id never wins a tie: ids rise along the row),
// or it is not finite (flagged; NaN and -inf are then rejected by topk_insert as in the scalar
// pass). Past the first few dozen ids almost every group of 8 is dismissed by one compare.
__attribute__((target("avx2,fma"))) void rank_row_avx2(const float* z, int64_t width, int64_t v0, int k,
                                                       float* vals, int64_t* idx, int& n, uint8_t& nonfinite) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 8 <= width; j += 8) {
    const __m256 v = _mm256_loadu_ps(z + j);
    int lanes = 0xff;
    if (n == k) {
      const __m256 odd = _mm256_cmp_ps(_mm256_and_ps(v, magnitude), inf, _CMP_NLT_UQ);  // NaN, +-inf
      lanes = _mm256_movemask_ps(_mm256_or_ps(odd, _mm256_cmp_ps(v, _mm256_set1_ps(vals[k - 1]), _CMP_GT_OQ)));
    }
    for (; lanes != 0; lanes &= lanes - 1) {
      const int l = __builtin_ctz(lanes);
      if (!std::isfinite(z[j + l])) nonfinite = 1;
      topk_insert(vals, idx, k, n, z[j + l], v0 + j + l);
    }
  }
  rank_row_scalar(z + j, width - j, v0 + j, k, vals, idx, n, nonfinite);
}
#endif

}  // namespace

void rank_logits_block(const float* scores, int64_t M, int64_t width, int64_t v0, int64_t V, int k, float* vals,
                       int64_t* idx, int* n, uint8_t* nonfinite, float* logits) {
#if defined(__x86_64__)
  static const bool avx2 = cpu_avx2_fma_enabled();
#endif
  for (int64_t m = 0; m < M; ++m) {
    const float* z = scores + m * width;
    if (logits != nullptr) std::copy(z, z + width, logits + m * V + v0);
#if defined(__x86_64__)
    if (avx2) {
      rank_row_avx2(z, width, v0, k, vals + m * k, idx + m * k, n[m], nonfinite[m]);
      continue;
    }
#endif
    rank_row_scalar(z, width, v0, k, vals + m * k, idx + m * k, n[m], nonfinite[m]);
  }
}

void head_logits_w4_range(const float* xn, int64_t M, int64_t H, const uint8_t* packed, const float* scales,
                          int64_t group, int64_t v_begin, int64_t v_end, float* scratch) {
  constexpr int64_t tile = quant::kCpuTileN;
  const int64_t t0 = v_begin / tile, t1 = (v_end + tile - 1) / tile, width = v_end - v_begin;
  // The range's tiles as a weight of `width` rows: the tile kernel writes scratch [M, width].
  quant::w4a16_matmul_cpu_tiles(xn, M, H, packed + t0 * (H / 2) * tile, scales + t0 * (H / group) * tile, group,
                                scratch, width, 0, t1 - t0);
}

void head_logits_packed_range(const float* xn, int64_t M, int64_t H, const void* panels,
                              const skinny::PreparedRowsBf16* bf16_rows, int64_t V, int64_t v_begin, int64_t v_end,
                              float* scratch) {
  constexpr int64_t panel = skinny::kPanel;
  const int64_t p0 = v_begin / panel, p1 = (v_end + panel - 1) / panel, width = v_end - v_begin;
  if (bf16_rows != nullptr)
    skinny::packed_linear_cpu_panels_into_bf16(*bf16_rows, static_cast<const uint16_t*>(panels), scratch, width, V, p0,
                                               p1);
  else
    skinny::packed_linear_cpu_panels_into(xn, M, H, static_cast<const float*>(panels), scratch, width, V, p0, p1);
}

namespace {

// Σ_j e^(z_j - top) over one row, 8 lanes at a time through the project's AVX2 exp (exp_avx2.h),
// the tail by libm; the scalar form where AVX2 + FMA are absent or capped.
#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float sum_exp_avx2(const float* z, int64_t n, float top) {
  __m256 acc = _mm256_setzero_ps();
  const __m256 t = _mm256_set1_ps(top);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) acc = _mm256_add_ps(acc, exp8_avx2(_mm256_sub_ps(_mm256_loadu_ps(z + j), t)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float s = 0.0f;
  for (float v : lanes) s += v;
  for (; j < n; ++j) s += std::exp(z[j] - top);
  return s;
}
#endif

float sum_exp_scalar(const float* z, int64_t n, float top) {
  float s = 0.0f;
  for (int64_t j = 0; j < n; ++j) s += std::exp(z[j] - top);
  return s;
}

}  // namespace

void block_max_sumexp(const float* scores, int64_t M, int64_t width, float* mx, float* se) {
#if defined(__x86_64__)
  static const bool avx2 = cpu_avx2_fma_enabled();
#else
  constexpr bool avx2 = false;
#endif
  for (int64_t m = 0; m < M; ++m) {
    const float* z = scores + m * width;
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < width; ++j) top = std::max(top, z[j]);
    mx[m] = top;
#if defined(__x86_64__)
    if (avx2) {
      se[m] = sum_exp_avx2(z, width, top);
      continue;
    }
#endif
    se[m] = sum_exp_scalar(z, width, top);
  }
}

void merge_lse(const float* mx, const float* se, int64_t parts, int64_t M, float* lse) {
  for (int64_t m = 0; m < M; ++m) {
    float top = -std::numeric_limits<float>::infinity();
    for (int64_t p = 0; p < parts; ++p) top = std::max(top, mx[p * M + m]);
    double sum = 0.0;  // ~600 ranges on a 151,936-id head: summed in double
    for (int64_t p = 0; p < parts; ++p) sum += static_cast<double>(se[p * M + m]) * std::exp(mx[p * M + m] - top);
    lse[m] = top + static_cast<float>(std::log(sum));
  }
}

template <typename Acc>
void merge_topk(const Acc* vals, const int64_t* idx, const int* n, int64_t parts, int64_t M, int k,
                Acc* out_vals, int64_t* out_idx) {
  for (int64_t m = 0; m < M; ++m) {
    int held = 0;
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t base = (p * M + m) * k;
      for (int j = 0; j < n[p * M + m]; ++j)
        topk_insert(out_vals + m * k, out_idx + m * k, k, held, vals[base + j], idx[base + j]);
    }
  }
}

template <typename T, typename Acc>
void eh_proj_range(const Acc* en, const Acc* hn, int64_t M, int64_t H, const T* eh_proj,
                   int64_t o_begin, int64_t o_end, Acc* out) {
  for (int64_t o = o_begin; o < o_end; ++o) {
    const T* we = eh_proj + o * 2 * H;  // columns [0, H): the embedding half
    const T* wh = we + H;               // columns [H, 2H): the hidden-state half
    for (int64_t m = 0; m < M; ++m) out[m * H + o] = dot<T, Acc>(en + m * H, we, H) + dot<T, Acc>(hn + m * H, wh, H);
  }
}

template <typename T, typename Acc>
int64_t gather_normalize_rows(const int64_t* tokens, const T* embed, int64_t V, const T* weight,
                              double eps, int64_t M, int64_t H, Acc* en) {
  for (int64_t m = 0; m < M; ++m) {
    if (tokens[m] < 0 || tokens[m] >= V) return m;
    normalize_row(embed + tokens[m] * H, weight, eps, H, en + m * H);
  }
  return -1;
}

#define SPECDEC_MTP_INSTANTIATE(T, Acc)                                                              \
  template void rms_normalize_rows<T, Acc>(const T*, const T*, double, int64_t, int64_t, Acc*);     \
  template void head_topk_range<T, Acc>(const Acc*, int64_t, int64_t, const T*, int64_t, int64_t, \
                                        int64_t, int, Acc*, int64_t*, int*, uint8_t*, Acc*);        \
  template void eh_proj_range<T, Acc>(const Acc*, const Acc*, int64_t, int64_t, const T*, int64_t, \
                                      int64_t, Acc*);                                               \
  template int64_t gather_normalize_rows<T, Acc>(const int64_t*, const T*, int64_t, const T*,       \
                                                 double, int64_t, int64_t, Acc*);

SPECDEC_MTP_INSTANTIATE(float, float)
SPECDEC_MTP_INSTANTIATE(double, double)
SPECDEC_MTP_INSTANTIATE(BFloat16, float)
SPECDEC_MTP_INSTANTIATE(Half16, float)
template void merge_topk<float>(const float*, const int64_t*, const int*, int64_t, int64_t, int, float*, int64_t*);
template void merge_topk<double>(const double*, const int64_t*, const int*, int64_t, int64_t, int, double*,
                                 int64_t*);

}  // namespace specdec::mtp
