// filter.h's radix selects run by one CUDA block, shared by sampling_cuda.cu (256 threads, 16-byte
// vector loads) and tree/tree_cuda.cu (1024 threads, strided loads).
//
// Block-collective: every thread of the block calls them with the same arguments. A thread visits
// the elements it owns through `for_each_s`: for_each_s(f) calls f(s) for the scaled value s of
// each of them (the caller's load pattern). Histograms are shared-memory atomics; thread 0 picks
// the digit with filter.h's rule and the block descends together.
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/sampling/distribution.h"
#include "kernels/sampling/filter.h"

namespace specdec {
namespace sampling {

// The k-th largest s of the row (no NaN): top-k's threshold.
template <class ForEachS>
__device__ __forceinline__ float block_kth_largest(ForEachS&& for_each_s, int64_t k) {
  __shared__ int count[kRadixBuckets];
  __shared__ uint32_t chosen_digit;
  __shared__ int64_t chosen_remaining;
  RadixPrefix rp;
  int64_t remaining = k;
  for (int round = 0; round < kRadixRounds; ++round) {
    for (int b = threadIdx.x; b < kRadixBuckets; b += blockDim.x) count[b] = 0;
    __syncthreads();
    for_each_s([&](float s) {
      const uint32_t key = float_order_key(s);
      if (rp.matches(key)) atomicAdd(&count[rp.digit(key)], 1);
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      chosen_digit = pick_count_digit(count, remaining);
      chosen_remaining = remaining;
    }
    __syncthreads();
    rp.descend(chosen_digit);
    remaining = chosen_remaining;
    __syncthreads();  // every thread has read the choice before the next round overwrites it
  }
  return rp.value();
}

// Top-p's threshold over p_i = exp(s_i - m) * inv_z for s_i >= threshold (mass in double, as the
// reference's cumsum); -inf when rounding leaves the total below top_p.
template <class ForEachS>
__device__ __forceinline__ float block_nucleus_threshold(ForEachS&& for_each_s, float threshold,
                                                         float m, float inv_z, float top_p) {
  __shared__ double mass[kRadixBuckets];
  __shared__ int chosen_digit;
  __shared__ double chosen_above;
  RadixPrefix rp;
  double above = 0.0;
  for (int round = 0; round < kRadixRounds; ++round) {
    for (int b = threadIdx.x; b < kRadixBuckets; b += blockDim.x) mass[b] = 0.0;
    __syncthreads();
    for_each_s([&](float s) {
      const uint32_t key = float_order_key(s);
      if (s >= threshold && rp.matches(key)) {
        atomicAdd(&mass[rp.digit(key)], static_cast<double>(exp_nonpos(s - m) * inv_z));
      }
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      chosen_digit = pick_mass_digit(mass, above, top_p, rp.first_round());
      chosen_above = above;
    }
    __syncthreads();
    if (chosen_digit < 0) return -INFINITY;  // the same for every thread
    rp.descend(static_cast<uint32_t>(chosen_digit));
    above = chosen_above;
    __syncthreads();
  }
  return rp.value();
}

}  // namespace sampling
}  // namespace specdec
