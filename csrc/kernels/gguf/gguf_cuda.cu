// CUDA GGUF kernels, first stage: correct and simple, not tuned. Both decode the blocks with
// blocks.h's dequantize_group32 (the CPU dequantiser's very code), 32 weights at a time.
//
// Dequantisation: one thread per 32-weight group of W, writing its 32 outputs.
//
// Matmul, one warp per row n of W (kWarps rows per block of threads):
//
//   row n:  [group 0][group 1] ... [group K/32 - 1]     lane l takes groups l, l + 32, ...
//   x rows m0 .. m0 + kRowsPerPass - 1, each against the lane's 32 dequantised weights
//   -> per lane and row: sum over its groups of (32-term fma chain); then a fixed xor-shuffle
//      reduction over the 32 lanes; lane 0 writes y[m, n].
//
// Every output is the same sequence of operations whatever M is, so a row of x gets the same
// bits alone or in a batch (the CPU kernels' order is a different one: CPU and CUDA agree to
// rounding). What a tuned version needs: x staged in shared memory, the weights read with 16-byte
// loads (a Q4_K block is 9 x 16 bytes), integer dot products on the codes, and M tiles on tensor
// cores for verification widths.
#include "kernels/gguf/gguf_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/gguf/blocks.h"

namespace specdec::gguf {
namespace {

constexpr int kWarps = 4;         // rows of W per block of threads (128 threads)
constexpr int kRowsPerPass = 8;   // rows of x a warp keeps accumulators for at once
constexpr int kDequantThreads = 256;

__device__ __forceinline__ float load_f(const float* p) { return *p; }
__device__ __forceinline__ float load_f(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load_f(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_f(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_f(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store_f(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T>
__global__ void dequantize_kernel(int32_t type, const uint8_t* __restrict__ weight, int64_t N, int64_t K,
                                  int64_t row_bytes, T* __restrict__ out) {
  const int64_t groups_per_row = K / 32;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g >= N * groups_per_row) return;
  const int64_t n = g / groups_per_row, gi = g % groups_per_row;
  float w[32];
  dequantize_group32(type, weight + n * row_bytes, gi, w);
  T* o = out + n * K + 32 * gi;
#pragma unroll
  for (int i = 0; i < 32; ++i) store_f(o + i, w[i]);
}

template <typename T>
__global__ void __launch_bounds__(32 * kWarps) matmul_warp_kernel(int32_t type, const T* __restrict__ x, int64_t M,
                                                                  int64_t K, const uint8_t* __restrict__ weight,
                                                                  int64_t row_bytes, T* __restrict__ y, int64_t N) {
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (n >= N) return;  // a whole warp leaves together: the shuffles below see full warps
  const uint8_t* row = weight + n * row_bytes;
  const int64_t groups = K / 32;
  for (int64_t m0 = 0; m0 < M; m0 += kRowsPerPass) {
    float acc[kRowsPerPass];
#pragma unroll
    for (int m = 0; m < kRowsPerPass; ++m) acc[m] = 0.0f;
    for (int64_t g = lane; g < groups; g += 32) {
      float w[32];
      dequantize_group32(type, row, g, w);
#pragma unroll
      for (int m = 0; m < kRowsPerPass; ++m) {
        if (m0 + m >= M) break;
        const T* xm = x + (m0 + m) * K + 32 * g;
        float s = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; ++i) s = fmaf(w[i], load_f(xm + i), s);
        acc[m] += s;
      }
    }
#pragma unroll
    for (int m = 0; m < kRowsPerPass; ++m) {
      float v = acc[m];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && m0 + m < M) store_f(y + (m0 + m) * N + n, v);
    }
  }
}

bool valid(int32_t type, int64_t N, int64_t K) {
  const int qk = block_weights(type);
  return qk > 0 && N >= 0 && K > 0 && K % qk == 0;
}

}  // namespace

cudaError_t launch_gguf_dequantize(int32_t type, const uint8_t* weight, int64_t N, int64_t K, void* out, Elem dtype,
                                   cudaStream_t stream) {
  if (!valid(type, N, K)) return cudaErrorInvalidValue;
  if (N == 0) return cudaSuccess;
  const int64_t row_bytes = K / block_weights(type) * block_bytes(type);
  const int64_t groups = N * (K / 32);
  const unsigned grid = static_cast<unsigned>((groups + kDequantThreads - 1) / kDequantThreads);
  switch (dtype) {
    case Elem::kFloat32:
      dequantize_kernel<<<grid, kDequantThreads, 0, stream>>>(type, weight, N, K, row_bytes, static_cast<float*>(out));
      break;
    case Elem::kFloat16:
      dequantize_kernel<<<grid, kDequantThreads, 0, stream>>>(type, weight, N, K, row_bytes, static_cast<__half*>(out));
      break;
    case Elem::kBFloat16:
      dequantize_kernel<<<grid, kDequantThreads, 0, stream>>>(type, weight, N, K, row_bytes,
                                                              static_cast<__nv_bfloat16*>(out));
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t launch_gguf_matmul(int32_t type, const void* x, int64_t M, int64_t K, const uint8_t* weight, void* y,
                               int64_t N, Elem dtype, cudaStream_t stream) {
  if (!valid(type, N, K) || M < 0) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  const int64_t row_bytes = K / block_weights(type) * block_bytes(type);
  const unsigned grid = static_cast<unsigned>((N + kWarps - 1) / kWarps);
  constexpr int threads = 32 * kWarps;
  switch (dtype) {
    case Elem::kFloat32:
      matmul_warp_kernel<<<grid, threads, 0, stream>>>(type, static_cast<const float*>(x), M, K, weight, row_bytes,
                                                       static_cast<float*>(y), N);
      break;
    case Elem::kFloat16:
      matmul_warp_kernel<<<grid, threads, 0, stream>>>(type, static_cast<const __half*>(x), M, K, weight, row_bytes,
                                                       static_cast<__half*>(y), N);
      break;
    case Elem::kBFloat16:
      matmul_warp_kernel<<<grid, threads, 0, stream>>>(type, static_cast<const __nv_bfloat16*>(x), M, K, weight,
                                                       row_bytes, static_cast<__nv_bfloat16*>(y), N);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace specdec::gguf
