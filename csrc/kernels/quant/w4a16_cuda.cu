// W4A16 GEMV-style kernel for small M (drafting and verification: M = 1..16), and a dequantiser
// for the dense path the glue takes at large M.
//
// Tiling (one thread block = 128 threads = 4 warps; ROWS output rows per block):
//
//        K  ->   chunk 0   chunk 1  ...  chunk 127  chunk 128 ...       (chunk = 32 input features
//   row n0     | t0      | t1      | ... | t127     | t0       | ...     = one 16-byte load)
//   row n0+1   | t0      | t1      | ... | t127     | t0       | ...
//   ...          (thread t reads chunk t, t+128, ... of every row of the block)
//
// Each thread keeps ROWS x MT float accumulators; a warp-shuffle tree and a 4-entry shared-memory
// sum per (row, activation row) finish the dot products. Splitting K inside the block (rather
// than giving each warp whole rows) keeps N / ROWS blocks in flight even for N = 4096, enough to
// cover the 132 SMs of an H100 / H200 several times over, and every load of a warp is 512
// contiguous bytes of one weight row.
//
// Dequantisation without integer-to-float conversions (I2F runs at 1/4 of the FMA rate):
//   lo = w & 0x0f0f0f0f, hi = (w >> 4) & 0x0f0f0f0f  -> byte i holds code 2i (lo) / 2i + 1 (hi)
//   prmt(lo, 0x43000000, 0x7i44) = 0x43 | byte_i | 0x00 | 0x00 = the float 128 + code (exact)
// so sum_k (code_k - 8) * x_k = sum_k (128 + code_k) * x_k - 136 * sum_k x_k, and the scale
// (one per chunk: groups are multiples of 32) multiplies the chunk's sum once. Activations and
// scales are fp16 or bf16; all arithmetic after loading is fp32.
#include "kernels/quant/w4a16_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace specdec::quant {
namespace {

constexpr int kThreads = 128;           // 4 warps: one block per 4 schedulers of an SM
constexpr int kWarps = kThreads / 32;
constexpr int kChunk = 32;              // input features per 16-byte load of packed weights

template <ActDType D>
struct Act;
template <>
struct Act<ActDType::kFloat16> {
  using T = __half;
  static __device__ __forceinline__ float2 pair(uint32_t bits) {
    __half2 h;
    *reinterpret_cast<uint32_t*>(&h) = bits;
    return __half22float2(h);
  }
  static __device__ __forceinline__ float one(T v) { return __half2float(v); }
  static __device__ __forceinline__ T store(float v) { return __float2half_rn(v); }
};
template <>
struct Act<ActDType::kBFloat16> {
  using T = __nv_bfloat16;
  // bf16 is the top half of an fp32: widening is a shift / mask.
  static __device__ __forceinline__ float2 pair(uint32_t bits) {
    return make_float2(__uint_as_float(bits << 16), __uint_as_float(bits & 0xffff0000u));
  }
  static __device__ __forceinline__ float one(T v) { return __bfloat162float(v); }
  static __device__ __forceinline__ T store(float v) { return __float2bfloat16_rn(v); }
};

// 128 + code of byte i of `nibbles` (each byte 0..15), as an exact float.
template <int I>
__device__ __forceinline__ float biased_code(uint32_t nibbles) {
  return __uint_as_float(__byte_perm(nibbles, 0x43000000u, 0x7044u | (I << 8)));
}

// Dot product of one 32-feature chunk of one weight row with xf, in "biased" form:
// sum_k (128 + code_k) * xf[k].  w: the chunk's 4 words, xf: 32 activations.
__device__ __forceinline__ float biased_dot(const uint4& w, const float* xf) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  float d0 = 0.f, d1 = 0.f;  // two chains to halve the FMA dependency depth
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t lo = words[j] & 0x0f0f0f0fu;         // codes 8j + 0, 2, 4, 6
    const uint32_t hi = (words[j] >> 4) & 0x0f0f0f0fu;  // codes 8j + 1, 3, 5, 7
    const float* xj = xf + 8 * j;
    d0 = fmaf(biased_code<0>(lo), xj[0], d0);
    d1 = fmaf(biased_code<0>(hi), xj[1], d1);
    d0 = fmaf(biased_code<1>(lo), xj[2], d0);
    d1 = fmaf(biased_code<1>(hi), xj[3], d1);
    d0 = fmaf(biased_code<2>(lo), xj[4], d0);
    d1 = fmaf(biased_code<2>(hi), xj[5], d1);
    d0 = fmaf(biased_code<3>(lo), xj[6], d0);
    d1 = fmaf(biased_code<3>(hi), xj[7], d1);
  }
  return d0 + d1;
}

// D:    activation / scale dtype
// MT:   activation rows handled (rows >= M are skipped; M <= MT)
// ROWS: output rows (weight rows) per block
// x:      [M, K] row-major, 16-byte aligned rows (K % 32 == 0)
// packed: [N, K/32] uint4 (= the int32 [N, K/8] LAYOUT_CUDA tensor)
// scales: [N, K/group]
// y:      [M, ldy], columns [0, N) written
template <ActDType D, int MT, int ROWS>
__global__ void __launch_bounds__(kThreads) w4a16_gemv_kernel(const typename Act<D>::T* __restrict__ x,
                                                              const uint4* __restrict__ packed,
                                                              const typename Act<D>::T* __restrict__ scales,
                                                              typename Act<D>::T* __restrict__ y, int M, int N,
                                                              int K, int group, int64_t ldy) {
  using A = Act<D>;
  const int n0 = blockIdx.x * ROWS;
  const int chunks = K / kChunk;
  const int groups = K / group;
  const int chunks_per_group = group / kChunk;

  float acc[ROWS][MT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.f;

  // Rows past N (last block) re-read row N-1 and are never written: no divergence in the loop.
  int row[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) row[r] = min(n0 + r, N - 1);

  for (int c = threadIdx.x; c < chunks; c += kThreads) {
    uint4 w[ROWS];
    float s[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      // Weights are read exactly once: stream them past L1 (ld.global.cs).
      w[r] = __ldcs(packed + static_cast<int64_t>(row[r]) * chunks + c);
      s[r] = A::one(scales[static_cast<int64_t>(row[r]) * groups + c / chunks_per_group]);
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      if (m < M) {
        // 32 activations of row m: 4 x 16-byte loads through the read-only path (x is reused by
        // every block, so it stays in L1 / L2).
        const uint4* xp = reinterpret_cast<const uint4*>(x + static_cast<int64_t>(m) * K) + c * 4;
        float xf[kChunk];
        float sum_x = 0.f;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const uint4 v = __ldg(xp + q);
          const uint32_t bits[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float2 f = A::pair(bits[e]);
            xf[8 * q + 2 * e] = f.x;
            xf[8 * q + 2 * e + 1] = f.y;
            sum_x += f.x + f.y;
          }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) acc[r][m] = fmaf(s[r], biased_dot(w[r], xf) - 136.f * sum_x, acc[r][m]);
      }
    }
  }

  // Reduce over the 128 threads: shuffles inside each warp, then 4 partials per output in smem.
  __shared__ float partial[kWarps][ROWS * MT];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0) partial[warp][r * MT + m] = v;
    }
  __syncthreads();
  for (int i = threadIdx.x; i < ROWS * MT; i += kThreads) {
    const int r = i / MT, m = i % MT;
    if (m < M && n0 + r < N) {
      float v = 0.f;
#pragma unroll
      for (int wp = 0; wp < kWarps; ++wp) v += partial[wp][i];
      y[static_cast<int64_t>(m) * ldy + n0 + r] = A::store(v);
    }
  }
}

// One thread per packed word: 8 consecutive weights of one row.
template <ActDType D>
__global__ void w4_dequantize_kernel(const uint32_t* __restrict__ packed, const typename Act<D>::T* __restrict__ scales,
                                     typename Act<D>::T* __restrict__ weight, int64_t N, int64_t K, int64_t group) {
  using A = Act<D>;
  const int64_t words_per_row = K / 8;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * words_per_row) return;
  const int64_t n = i / words_per_row, c = i % words_per_row;
  const uint32_t w = packed[i];
  const float s = A::one(scales[n * (K / group) + (8 * c) / group]);
  typename A::T* out = weight + n * K + 8 * c;
#pragma unroll
  for (int j = 0; j < 8; ++j) out[j] = A::store(static_cast<float>(static_cast<int>((w >> (4 * j)) & 15u) - 8) * s);
}

template <ActDType D, int MT, int ROWS>
cudaError_t launch_gemv(const void* x, const int32_t* packed, const void* scales, void* y, int64_t M, int64_t N,
                        int64_t K, int64_t group, int64_t ldy, cudaStream_t stream) {
  using T = typename Act<D>::T;
  const dim3 grid(static_cast<unsigned>((N + ROWS - 1) / ROWS));
  w4a16_gemv_kernel<D, MT, ROWS><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(x), reinterpret_cast<const uint4*>(packed), static_cast<const T*>(scales),
      static_cast<T*>(y), static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), static_cast<int>(group),
      ldy);
  return cudaGetLastError();
}

// ROWS per M bucket: more output rows per block when there are few activation rows (more bytes
// in flight per thread), fewer when ROWS x MT accumulators would spill registers.
template <ActDType D>
cudaError_t dispatch_gemv(const void* x, const int32_t* packed, const void* scales, void* y, int64_t M, int64_t N,
                          int64_t K, int64_t group, int64_t ldy, cudaStream_t stream) {
  if (M <= 1) return launch_gemv<D, 1, 8>(x, packed, scales, y, M, N, K, group, ldy, stream);
  if (M <= 2) return launch_gemv<D, 2, 8>(x, packed, scales, y, M, N, K, group, ldy, stream);
  if (M <= 4) return launch_gemv<D, 4, 4>(x, packed, scales, y, M, N, K, group, ldy, stream);
  if (M <= 8) return launch_gemv<D, 8, 2>(x, packed, scales, y, M, N, K, group, ldy, stream);
  return launch_gemv<D, 16, 2>(x, packed, scales, y, M, N, K, group, ldy, stream);
}

}  // namespace

cudaError_t launch_w4a16_gemv(const void* x, const int32_t* packed, const void* scales, void* y, int64_t M,
                              int64_t N, int64_t K, int64_t group, int64_t ldy, ActDType dtype,
                              cudaStream_t stream) {
  if (M < 1 || M > kGemvMaxM || N < 1 || K < kChunk || K % kChunk != 0 || group < kChunk || group % kChunk != 0 ||
      K % group != 0 || N > (int64_t{1} << 30) || K > (int64_t{1} << 30) || ldy < N)
    return cudaErrorInvalidValue;
  return dtype == ActDType::kFloat16 ? dispatch_gemv<ActDType::kFloat16>(x, packed, scales, y, M, N, K, group, ldy, stream)
                                     : dispatch_gemv<ActDType::kBFloat16>(x, packed, scales, y, M, N, K, group, ldy, stream);
}

cudaError_t launch_w4_dequantize(const int32_t* packed, const void* scales, void* weight, int64_t N, int64_t K,
                                 int64_t group, ActDType dtype, cudaStream_t stream) {
  if (N < 0 || K % 8 != 0 || group < 8 || group % 8 != 0 || K % group != 0) return cudaErrorInvalidValue;
  const int64_t words = N * (K / 8);
  if (words == 0) return cudaSuccess;
  const int threads = 256;
  const dim3 grid(static_cast<unsigned>((words + threads - 1) / threads));
  const auto* p = reinterpret_cast<const uint32_t*>(packed);
  if (dtype == ActDType::kFloat16)
    w4_dequantize_kernel<ActDType::kFloat16><<<grid, threads, 0, stream>>>(
        p, static_cast<const __half*>(scales), static_cast<__half*>(weight), N, K, group);
  else
    w4_dequantize_kernel<ActDType::kBFloat16><<<grid, threads, 0, stream>>>(
        p, static_cast<const __nv_bfloat16*>(scales), static_cast<__nv_bfloat16*>(weight), N, K, group);
  return cudaGetLastError();
}

}  // namespace specdec::quant
