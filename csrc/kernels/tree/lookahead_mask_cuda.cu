// CUDA kernel of lookahead_mask (torch-free): one block per (slot v, row b) writes mask row
// [b, v, :] with one thread per key slot, so the (B, T, T) output is written coalesced. Every block
// checks its row's G guess lengths and stages them in shared memory (G reads against T writes; T =
// 1 + G * K + W * L is a few hundred at most) rather than waiting on a separate validation launch.
// Grid: (T, min(B, 65535)); rows beyond the y limit are taken in turn by the same blocks.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/status.h"
#include "kernels/tree/lookahead_mask.h"

namespace specdec {
namespace tree {
namespace {

constexpr int kMaskThreads = 128;  // T is a few hundred at most: one or two passes per row
constexpr int kMaxLaunchGuesses = 256;  // guess lengths staged per block (G is a few dozen)

__global__ void lookahead_mask_kernel(LookaheadMaskArgs a) {
  __shared__ int64_t lens_s[kMaxLaunchGuesses];
  __shared__ bool ok_s;
  const LookaheadShape s = a.shape;
  const int64_t t = lookahead_width(s);
  const int64_t v = blockIdx.x;
  // Rows past the grid's y limit (65535) are taken in turn by the same blocks.
  for (int64_t b = blockIdx.y; b < a.batch; b += gridDim.y) {
    const int64_t* lens = a.guess_lens + b * s.num_guesses;
    __syncthreads();  // the previous row's lens_s / ok_s are no longer read
    if (threadIdx.x == 0) ok_s = lookahead_row_ok(s, lens, a.cache_len[b]);
    __syncthreads();
    const bool ok = ok_s;
    // A flagged row is laid out as if no guess had a token, at position 0 (as the CPU kernel does).
    for (int64_t g = threadIdx.x; g < s.num_guesses; g += blockDim.x) lens_s[g] = ok ? lens[g] : 0;
    __syncthreads();
    if (threadIdx.x == 0) {
      a.positions[b * t + v] = (ok ? a.cache_len[b] : 0) + lookahead_offset(s, lens_s, v);
      if (v == 0) a.status[b] = ok ? kStatusOk : kStatusMalformedTree;
    }
    uint8_t* row = a.tree_mask + (b * t + v) * t;
    for (int64_t u = threadIdx.x; u < t; u += blockDim.x)
      row[u] = lookahead_visible(s, lens_s, v, u) ? 1 : 0;
  }
}

}  // namespace

int lookahead_mask_cuda(const LookaheadMaskArgs& a, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t t = lookahead_width(a.shape);
  if (a.batch == 0) return cudaSuccess;
  // The glue bounds G by kMaxLaunchGuesses; checked again here since a launch past it would write
  // out of lens_s's bounds.
  if (a.shape.num_guesses > kMaxLaunchGuesses || t > INT32_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(t), static_cast<unsigned>(a.batch < 65535 ? a.batch : 65535));
  lookahead_mask_kernel<<<grid, kMaskThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace tree
}  // namespace specdec
