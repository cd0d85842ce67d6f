// CPU MTP-head kernels (see mtp_cpu.h). The dot products are `omp simd` reductions compiled
// for AVX-512, AVX2 and baseline x86-64 and picked at load time (target_clones): the default
// build targets baseline x86-64, and these loops are bound by reading lm_head / eh_proj.
#include "kernels/mtp/mtp_cpu.h"

#include <cmath>
#include <type_traits>

#include "kernels/common/dtype.h"
#include "kernels/mtp/topk.h"
#include "kernels/quant/w4_cpu.h"

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

// Four dots sharing one weight row: a0..a3 against b, so b (and its bf16 decode) is loaded once
// per four activation rows. Callers with fewer rows pass a row twice and drop the extra sums.
SPECDEC_MTP_CLONES void dot4_f32(const float* a0, const float* a1, const float* a2, const float* a3, const float* b,
                                 int64_t n, float* out) {
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) {
    const float w = b[i];
    s0 += a0[i] * w;
    s1 += a1[i] * w;
    s2 += a2[i] * w;
    s3 += a3[i] * w;
  }
  out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
}

SPECDEC_MTP_CLONES void dot4_bf16(const float* a0, const float* a1, const float* a2, const float* a3,
                                  const uint16_t* b, int64_t n, float* out) {
  float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
  for (int64_t i = 0; i < n; ++i) {
    const float w = bits_to_float(static_cast<uint32_t>(b[i]) << 16);
    s0 += a0[i] * w;
    s1 += a1[i] * w;
    s2 += a2[i] * w;
    s3 += a3[i] * w;
  }
  out[0] = s0, out[1] = s1, out[2] = s2, out[3] = s3;
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
  constexpr bool kBlocked = std::is_same_v<T, float> || std::is_same_v<T, BFloat16>;
  for (int64_t v = v_begin; v < v_end; ++v) {
    const T* w = lm_head + v * H;  // read once, reused (from L1) for every activation row
    for (int64_t m0 = 0; m0 < M; m0 += kBlocked ? 4 : 1) {
      Acc z[4];
      int rows = 1;
      if (kBlocked && M - m0 == 1) {
        z[0] = dot<T, Acc>(xn + m0 * H, w, H);  // a lone row: no wasted lanes of dot4
      } else if constexpr (kBlocked) {
        rows = static_cast<int>(M - m0 < 4 ? M - m0 : 4);
        const Acc* a = xn + m0 * H;
        const Acc* r1 = rows > 1 ? a + H : a;
        const Acc* r2 = rows > 2 ? a + 2 * H : a;
        const Acc* r3 = rows > 3 ? a + 3 * H : a;
        if constexpr (std::is_same_v<T, float>) {
          dot4_f32(a, r1, r2, r3, w, H, z);
        } else {
          dot4_bf16(a, r1, r2, r3, reinterpret_cast<const uint16_t*>(w), H, z);
        }
      } else {
        z[0] = dot<T, Acc>(xn + m0 * H, w, H);
      }
      for (int r = 0; r < rows; ++r) {
        const int64_t m = m0 + r;
        if (!std::isfinite(z[r])) nonfinite[m] = 1;
        if (logits != nullptr) logits[m * V + v] = z[r];
        topk_insert(vals + m * k, idx + m * k, k, n[m], z[r], v);
      }
    }
  }
}

void head_topk_w4_range(const float* xn, int64_t M, int64_t H, const uint8_t* packed, const float* scales,
                        int64_t group, int64_t V, int64_t v_begin, int64_t v_end, int k, float* vals,
                        int64_t* idx, int* n, uint8_t* nonfinite, float* logits, float* scratch) {
  constexpr int64_t tile = quant::kCpuTileN;
  const int64_t t0 = v_begin / tile, t1 = (v_end + tile - 1) / tile, width = v_end - v_begin;
  // The range's tiles as a weight of `width` rows: the tile kernel writes scratch [M, width].
  quant::w4a16_matmul_cpu_tiles(xn, M, H, packed + t0 * (H / 2) * tile, scales + t0 * (H / group) * tile, group,
                                scratch, width, 0, t1 - t0);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < width; ++j) {
      const float z = scratch[m * width + j];
      if (!std::isfinite(z)) nonfinite[m] = 1;
      if (logits != nullptr) logits[m * V + v_begin + j] = z;
      topk_insert(vals + m * k, idx + m * k, k, n[m], z, v_begin + j);
    }
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
