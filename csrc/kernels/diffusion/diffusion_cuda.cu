// CUDA kernels of `diffusion_unmask`: the math of kernels/diffusion/unmask.h, with every pass over
// the vocabulary spread over the threads of one block and reduced in shared memory.
//
//   step 1  grid = batch * width blocks of kThreads; block (b, w) returns at once unless the
//           position is masked and the row's parameters are valid. Passes over V (thread t reads
//           entries t, t + kThreads, ...; logits decoded on the fly, nothing staged):
//             max + NaN flag | [top-k: 32 counting passes] | Z | [top-p: 32 mass passes, Z] | race
//   step 2  grid = batch blocks of kThreads; thread t ranks positions t, t + kThreads, ... of the
//           row (the window is one block of a few dozen positions).
#include "kernels/diffusion/diffusion_cuda.h"

#include <cmath>
#include <cstdint>

namespace specdec {
namespace diffusion {
namespace {

// 256 threads: 8 warps, enough to stream a 2k-150k vocabulary; more only adds reduction depth.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// Block-wide reduction of one value with `op`; every thread gets the result. `scratch` holds one
// value per warp; the call is collective (all threads of the block must reach it).
template <class T, class Op>
__device__ T block_reduce(T v, Op op, T* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();  // scratch may still be read by the previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T r = scratch[0];
  for (int i = 1; i < kWarps; ++i) r = op(r, scratch[i]);
  return r;
}

struct MaxOp {
  __device__ float operator()(float x, float y) const { return x > y ? x : y; }
};
template <class T>
struct SumOp {
  __device__ T operator()(T x, T y) const { return x + y; }
};
struct OrOp {
  __device__ int operator()(int x, int y) const { return x | y; }
};

// The race winner: the larger key, ties to the lower index (RaceBest's rule), over the block.
__device__ sampling::RaceBest block_race(sampling::RaceBest best, float* keys, int64_t* indices) {
  __syncthreads();
  keys[threadIdx.x] = best.key;
  indices[threadIdx.x] = best.index;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) {
      sampling::RaceBest mine{keys[threadIdx.x], indices[threadIdx.x]};
      mine.offer(keys[threadIdx.x + stride], indices[threadIdx.x + stride]);
      keys[threadIdx.x] = mine.key;
      indices[threadIdx.x] = mine.index;
    }
    __syncthreads();
  }
  return {keys[0], indices[0]};
}

__global__ void __launch_bounds__(kThreads) unmask_positions_kernel(UnmaskArgs a) {
  __shared__ float f_scratch[kWarps];
  __shared__ double d_scratch[kWarps];
  __shared__ int i_scratch[kWarps];
  __shared__ float race_keys[kThreads];
  __shared__ int64_t race_indices[kThreads];
  const int64_t flat = blockIdx.x;
  const int64_t b = flat / a.width, w = flat % a.width;
  const int64_t V = a.vocab;
  if (bad_row_params(a, b) || !is_masked(a, b, w)) {
    if (threadIdx.x == 0) {
      a.sampled[flat] = -1;
      a.confidence[flat] = -INFINITY;
      a.position_status[flat] = kStatusOk;
    }
    return;
  }
  const float temperature = a.temperature[b];
  const bool greedy = temperature == 0.0f;
  const float divisor = greedy ? 1.0f : temperature;
  auto scaled = [&](int64_t i) { return logit_at(a, b, w, i) / divisor; };

  float m = -INFINITY;
  int bad = 0;
  for (int64_t i = threadIdx.x; i < V; i += kThreads) {
    const float x = scaled(i);
    m = x > m ? x : m;
    bad |= static_cast<int>(x != x) | static_cast<int>(x == INFINITY);
  }
  m = block_reduce(m, MaxOp{}, f_scratch);
  bad = block_reduce(bad, OrOp{}, i_scratch);
  if (sampling::row_unusable(bad != 0, m)) {
    if (threadIdx.x == 0) {
      a.sampled[flat] = -1;
      a.confidence[flat] = -INFINITY;
      a.position_status[flat] = kStatusNonFiniteLogits;
    }
    return;
  }

  float t = -INFINITY;
  auto partition = [&](float cut) {  // Z = sum over s >= cut of exp(s - m)
    float z = 0.0f;
    for (int64_t i = threadIdx.x; i < V; i += kThreads) z += kept_weight(scaled(i), m, cut);
    return block_reduce(z, SumOp<float>{}, f_scratch);
  };
  if (!greedy) {
    const int32_t top_k = a.top_k[b];
    if (top_k > 0 && top_k < V) {
      const uint32_t key = largest_key_where([&](uint32_t trial) {
        int count = 0;
        for (int64_t i = threadIdx.x; i < V; i += kThreads) count += float_order_key(scaled(i)) >= trial;
        return block_reduce(count, SumOp<int>{}, i_scratch) >= top_k;
      });
      t = float_from_order_key(key);
    }
  }
  float z = partition(t);
  sampling::RaceBest best{-INFINITY, V};
  if (greedy) {
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      if (scaled(i) == m) best.offer(0.0f, i);  // the first maximum, as torch.argmax
    }
  } else {
    const float top_p = a.top_p[b];
    if (top_p < 1.0f) {
      const float inv_z = 1.0f / z;
      auto reaches = [&](uint32_t trial) {
        double mass = 0.0;
        for (int64_t i = threadIdx.x; i < V; i += kThreads) {
          const float x = scaled(i);
          if (float_order_key(x) >= trial) mass += kept_weight(x, m, t) * inv_z;
        }
        return static_cast<float>(block_reduce(mass, SumOp<double>{}, d_scratch)) >= top_p;
      };
      if (reaches(0u)) {
        const float cut = float_from_order_key(largest_key_where(reaches));
        if (cut > t) {
          t = cut;
          z = partition(t);
        }
      }
    }
    const RandomStream stream = position_stream(a, b, w);
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const float x = scaled(i);
      if (x >= t) best.offer(race_key(x, stream, i), i);
    }
  }
  best = block_race(best, race_keys, race_indices);
  if (threadIdx.x == 0) {
    a.sampled[flat] = best.index;
    a.confidence[flat] = kept_weight(scaled(best.index), m, t) / z;
    a.position_status[flat] = kStatusOk;
  }
}

__global__ void __launch_bounds__(kThreads) unmask_select_kernel(UnmaskArgs a) {
  __shared__ int32_t row_status;
  const int64_t b = blockIdx.x;
  if (threadIdx.x == 0) {
    int32_t status = bad_row_params(a, b) ? int32_t{kStatusBadSamplingParams} : int32_t{kStatusOk};
    for (int64_t w = 0; w < a.width && status == kStatusOk; ++w) {
      status = a.position_status[b * a.width + w];
    }
    row_status = status;
    a.status[b] = status;
  }
  __syncthreads();
  const int32_t status = row_status;
  for (int64_t w = threadIdx.x; w < a.width; w += kThreads) {
    a.keep[b * a.width + w] = keep_position(a, b, w, status);
  }
  if (status == kStatusOk) return;
  __syncthreads();  // every rank read the confidences before they are cleared
  for (int64_t w = threadIdx.x; w < a.width; w += kThreads) {
    a.sampled[b * a.width + w] = -1;
    a.confidence[b * a.width + w] = -INFINITY;
  }
}

}  // namespace

cudaError_t launch_unmask(const UnmaskArgs& a, cudaStream_t stream) {
  if (a.batch == 0 || a.width == 0) return cudaSuccess;
  unmask_positions_kernel<<<static_cast<unsigned>(a.batch * a.width), kThreads, 0, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  unmask_select_kernel<<<static_cast<unsigned>(a.batch), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace diffusion
}  // namespace specdec
