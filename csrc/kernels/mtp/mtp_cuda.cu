// CUDA MTP-head kernels (see mtp_cuda.h for the launch plan and mtp_cpu.h for the math).
#include "kernels/mtp/mtp_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "kernels/common/dtype.h"
#include "kernels/common/status.h"
#include "kernels/mtp/topk.h"

namespace specdec::mtp {
namespace {

constexpr int kWarps = 8;  // per scan block: 8 lm_head rows in flight per SM block
constexpr int kMaxRows = 8;  // activation rows per scan block (register accumulators per lane)

template <typename T>
__device__ __forceinline__ float load_f(const T* p) {
  return to_float(*p);
}
template <>
__device__ __forceinline__ float load_f<float>(const float* p) {
  return __ldg(p);
}

template <typename T, typename Acc>
__device__ __forceinline__ Acc load_acc(const T* p) {
  if constexpr (sizeof(Acc) == 8) {
    return __ldg(reinterpret_cast<const double*>(p));
  } else {
    return load_f<T>(p);
  }
}

template <typename Acc>
__device__ __forceinline__ Acc warp_sum(Acc v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One block per row: out[m] = rms_norm(src[m]) * weight, src row m = x + row[m] * H.
template <typename T, typename Acc>
__global__ void normalize_kernel(const T* x, const int64_t* rows, int64_t num_src_rows, const T* weight, double eps,
                                 int64_t H, Acc* out, int32_t* status) {
  const int64_t m = blockIdx.x;
  int64_t src = m;
  if (rows != nullptr) {
    src = rows[m];
    if (src < 0 || src >= num_src_rows) {  // a token outside the vocabulary: flag, write zeros
      for (int64_t i = threadIdx.x; i < H; i += blockDim.x) out[m * H + i] = Acc(0);
      if (threadIdx.x == 0) status[m] = kStatusDraftTokenOutOfRange;
      return;
    }
  }
  const T* row = x + src * H;
  Acc ss = 0;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    const Acc v = load_acc<T, Acc>(row + i);
    ss += v * v;
  }
  __shared__ Acc partial[32];
  ss = warp_sum(ss);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    Acc s = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : Acc(0);
    s = warp_sum(s);
    if (threadIdx.x == 0) partial[0] = s;
  }
  __syncthreads();
  const Acc r = Acc(1) / sqrt(partial[0] / static_cast<Acc>(H) + static_cast<Acc>(eps));
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
    out[m * H + i] = load_acc<T, Acc>(row + i) * r * load_acc<T, Acc>(weight + i);
  if (rows != nullptr && threadIdx.x == 0) status[m] = kStatusOk;
}

// Lane-partial dots of one weight row w [H] with `rows` activation rows a [rows, H] (Acc). The
// lanes stride H one element at a time: consecutive lanes read consecutive elements (coalesced
// 64 / 128-byte warp loads), and the compiler unrolls the loop to keep several loads in flight.
template <typename T, typename Acc, int ROWS>
__device__ __forceinline__ void lane_dots(const T* w, const Acc* a, int rows, int64_t H, Acc (&acc)[ROWS]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r) acc[r] = 0;
  const int lane = threadIdx.x & 31;
#pragma unroll 4
  for (int64_t i = lane; i < H; i += 32) {
    const Acc wv = load_acc<T, Acc>(w + i);
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
      if (r < rows) acc[r] += wv * a[r * H + i];
  }
}

// grid (parts, ceil(M / ROWS)); block kWarps warps. Shared: tile logits [ROWS][kVocabTile].
template <typename T, typename Acc, int ROWS>
__global__ void __launch_bounds__(kWarps * 32)
    head_scan_kernel(const Acc* xn, int64_t M, int64_t H, const T* lm_head, int64_t V, int k, Acc* part_vals,
                     int64_t* part_idx, uint8_t* part_bad, Acc* logits) {
  __shared__ Acc tile[ROWS][kVocabTile];
  const int64_t part = blockIdx.x, v0 = part * kVocabTile;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * ROWS;
  const int rows = static_cast<int>(M - m0 < ROWS ? M - m0 : ROWS);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const Acc* a = xn + m0 * H;
  for (int j = warp; j < kVocabTile; j += kWarps) {
    const int64_t v = v0 + j;
    if (v >= V) break;
    Acc acc[ROWS];
    lane_dots<T, Acc, ROWS>(lm_head + v * H, a, rows, H, acc);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const Acc z = warp_sum(acc[r]);
      if (lane == 0 && r < rows) {
        tile[r][j] = z;
        if (logits != nullptr) logits[(m0 + r) * V + v] = z;
      }
    }
  }
  __syncthreads();
  // One thread per activation row selects the tile's top-k with topk.h (the CPU kernel's code).
  if (threadIdx.x < rows) {
    const int r = threadIdx.x;
    const int64_t n_tile = V - v0 < kVocabTile ? V - v0 : kVocabTile;
    Acc vals[kMaxK];
    int64_t idx[kMaxK];
    int held = 0;
    bool bad = false;
    for (int j = 0; j < n_tile; ++j) {
      const Acc z = tile[r][j];
      bad |= !isfinite(z);
      topk_insert(vals, idx, k, held, z, v0 + j);
    }
    const int64_t base = (part * M + m0 + r) * k;
    for (int j = 0; j < k; ++j) {  // a tile holds >= 1 row; short lists are padded with -inf
      part_vals[base + j] = j < held ? vals[j] : -INFINITY;
      part_idx[base + j] = j < held ? idx[j] : V;
    }
    part_bad[part * M + m0 + r] = bad;
  }
}

// One warp per activation row: lane l merges parts l, l + 32, ...; lane 0 merges the lanes.
template <typename Acc>
__global__ void merge_kernel(const Acc* part_vals, const int64_t* part_idx, const uint8_t* part_bad, int64_t parts,
                             int64_t M, int64_t V, int k, Acc* values, int64_t* indices, int32_t* status) {
  const int64_t m = blockIdx.x;
  const int lane = threadIdx.x;
  __shared__ Acc s_vals[32][kMaxK];
  __shared__ int64_t s_idx[32][kMaxK];
  __shared__ int s_held[32];
  Acc vals[kMaxK];
  int64_t idx[kMaxK];
  int held = 0;
  bool bad = false;
  for (int64_t p = lane; p < parts; p += 32) {
    const int64_t base = (p * M + m) * k;
    bad |= part_bad[p * M + m] != 0;
    for (int j = 0; j < k; ++j)  // index V: the padding of a tile shorter than k
      if (part_idx[base + j] < V) topk_insert(vals, idx, k, held, part_vals[base + j], part_idx[base + j]);
  }
  for (int j = 0; j < held; ++j) {
    s_vals[lane][j] = vals[j];
    s_idx[lane][j] = idx[j];
  }
  s_held[lane] = held;
  const bool any_bad = __any_sync(0xffffffffu, bad);
  __syncwarp();
  if (lane == 0) {
    int n = 0;
    for (int l = 0; l < 32; ++l)
      for (int j = 0; j < s_held[l]; ++j) topk_insert(vals, idx, k, n, s_vals[l][j], s_idx[l][j]);
    for (int j = 0; j < k; ++j) {
      values[m * k + j] = vals[j];
      indices[m * k + j] = idx[j];
    }
    status[m] = any_bad ? kStatusNonFiniteLogits : kStatusOk;
  }
}

// grid (ceil(H / kWarps)); a warp per output feature o: out[m, o] = <We[o], en[m]> + <Wh[o], hn[m]>
// for all M rows (chunks of kMaxRows), the two halves of eh_proj [H, 2H] read in place.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kWarps * 32)
    eh_proj_kernel(const Acc* en, const Acc* hn, int64_t M, int64_t H, const T* eh_proj, Acc* out) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (o >= H) return;
  const int lane = threadIdx.x & 31;
  for (int64_t m0 = 0; m0 < M; m0 += kMaxRows) {
    const int rows = static_cast<int>(M - m0 < kMaxRows ? M - m0 : kMaxRows);
    Acc ae[kMaxRows], ah[kMaxRows];
    lane_dots<T, Acc, kMaxRows>(eh_proj + o * 2 * H, en + m0 * H, rows, H, ae);
    lane_dots<T, Acc, kMaxRows>(eh_proj + o * 2 * H + H, hn + m0 * H, rows, H, ah);
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      const Acc z = warp_sum(ae[r] + ah[r]);
      if (lane == 0 && r < rows) out[(m0 + r) * H + o] = z;
    }
  }
}

template <typename T, typename Acc>
cudaError_t head_topk_typed(const T* x, const T* norm_weight, const T* lm_head, double eps, int64_t M, int64_t H,
                            int64_t V, int k, Acc* xn, Acc* part_vals, int64_t* part_idx, uint8_t* part_bad,
                            Acc* values, int64_t* indices, Acc* logits, int32_t* status, cudaStream_t stream) {
  normalize_kernel<T, Acc><<<static_cast<unsigned>(M), 256, 0, stream>>>(x, nullptr, M, norm_weight, eps, H, xn,
                                                                         nullptr);
  const int64_t parts = (V + kVocabTile - 1) / kVocabTile;
  // Row blocks of 8 / 4 / 2 / 1 activation rows: the template that wastes the fewest lanes.
  const int rows = M >= 8 ? 8 : (M >= 4 ? 4 : (M >= 2 ? 2 : 1));
  const dim3 grid(static_cast<unsigned>(parts), static_cast<unsigned>((M + rows - 1) / rows));
  switch (rows) {
    case 8:
      head_scan_kernel<T, Acc, 8><<<grid, kWarps * 32, 0, stream>>>(xn, M, H, lm_head, V, k, part_vals, part_idx,
                                                                     part_bad, logits);
      break;
    case 4:
      head_scan_kernel<T, Acc, 4><<<grid, kWarps * 32, 0, stream>>>(xn, M, H, lm_head, V, k, part_vals, part_idx,
                                                                     part_bad, logits);
      break;
    case 2:
      head_scan_kernel<T, Acc, 2><<<grid, kWarps * 32, 0, stream>>>(xn, M, H, lm_head, V, k, part_vals, part_idx,
                                                                     part_bad, logits);
      break;
    default:
      head_scan_kernel<T, Acc, 1><<<grid, kWarps * 32, 0, stream>>>(xn, M, H, lm_head, V, k, part_vals, part_idx,
                                                                     part_bad, logits);
  }
  merge_kernel<Acc><<<static_cast<unsigned>(M), 32, 0, stream>>>(part_vals, part_idx, part_bad, parts, M, V, k, values,
                                                                 indices, status);
  return cudaGetLastError();
}

template <typename T, typename Acc>
cudaError_t mtp_input_typed(const T* h, const int64_t* tokens, const T* embed, int64_t V, const T* enorm_weight,
                            const T* hnorm_weight, const T* eh_proj, double eps, int64_t M, int64_t H, Acc* en,
                            Acc* hn, Acc* out, int32_t* status, cudaStream_t stream) {
  normalize_kernel<T, Acc><<<static_cast<unsigned>(M), 256, 0, stream>>>(embed, tokens, V, enorm_weight, eps, H, en,
                                                                         status);
  normalize_kernel<T, Acc><<<static_cast<unsigned>(M), 256, 0, stream>>>(h, nullptr, M, hnorm_weight, eps, H, hn,
                                                                         nullptr);
  eh_proj_kernel<T, Acc><<<static_cast<unsigned>((H + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(
      en, hn, M, H, eh_proj, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_head_topk(int dtype, const void* x, const void* norm_weight, const void* lm_head, double eps,
                             int64_t M, int64_t H, int64_t V, int k, void* xn, void* part_vals, int64_t* part_idx,
                             uint8_t* part_bad, void* values, int64_t* indices, void* logits, int32_t* status,
                             cudaStream_t stream) {
#define SPECDEC_HEAD(T, Acc)                                                                                      \
  head_topk_typed<T, Acc>(static_cast<const T*>(x), static_cast<const T*>(norm_weight),                          \
                          static_cast<const T*>(lm_head), eps, M, H, V, k, static_cast<Acc*>(xn),                \
                          static_cast<Acc*>(part_vals), part_idx, part_bad, static_cast<Acc*>(values), indices, \
                          static_cast<Acc*>(logits), status, stream)
  switch (static_cast<DType>(dtype)) {
    case DType::kFloat32: return SPECDEC_HEAD(float, float);
    case DType::kFloat16: return SPECDEC_HEAD(Half16, float);
    case DType::kBFloat16: return SPECDEC_HEAD(BFloat16, float);
    case DType::kFloat64: return SPECDEC_HEAD(double, double);
  }
#undef SPECDEC_HEAD
  return cudaErrorInvalidValue;
}

cudaError_t launch_mtp_input(int dtype, const void* h, const int64_t* tokens, const void* embed, int64_t V,
                             const void* enorm_weight, const void* hnorm_weight, const void* eh_proj, double eps,
                             int64_t M, int64_t H, void* en, void* hn, void* out, int32_t* status,
                             cudaStream_t stream) {
#define SPECDEC_INPUT(T, Acc)                                                                                      \
  mtp_input_typed<T, Acc>(static_cast<const T*>(h), tokens, static_cast<const T*>(embed), V,                      \
                          static_cast<const T*>(enorm_weight), static_cast<const T*>(hnorm_weight),               \
                          static_cast<const T*>(eh_proj), eps, M, H, static_cast<Acc*>(en), static_cast<Acc*>(hn), \
                          static_cast<Acc*>(out), status, stream)
  switch (static_cast<DType>(dtype)) {
    case DType::kFloat32: return SPECDEC_INPUT(float, float);
    case DType::kFloat16: return SPECDEC_INPUT(Half16, float);
    case DType::kBFloat16: return SPECDEC_INPUT(BFloat16, float);
    case DType::kFloat64: return SPECDEC_INPUT(double, double);
  }
#undef SPECDEC_INPUT
  return cudaErrorInvalidValue;
}

}  // namespace specdec::mtp
