// CUDA kernel of the DDTree build: one thread block per batch row.
//
// The best-first search is sequential by nature (each pop decides the next push), so thread 0 of
// the block runs it, the same code as the CPU kernel (ddtree.h), on a workspace in shared memory
// when it fits (64 bytes per node: 16.4 KB at M = 256; up to M = 766 under the 48 KB default) and
// in the global workspace otherwise. Meanwhile the other threads zero the row's
// (M + 1) x (M + 1) visibility mask with coalesced stores (the bulk of the bytes); then every
// thread marks the ancestors of its nodes (at most depth D bytes per node).
#include <cuda_runtime.h>

#include "kernels/ddtree/ddtree.h"

namespace specdec {
namespace ddtree {
namespace {

// 256 threads: zeroing 66 KB of mask per row at M = 256 is the widest part; the search is one thread.
constexpr int kThreads = 256;
constexpr size_t kSharedLimit = 48 * 1024;

size_t shared_bytes(int64_t budget) {
  const size_t n = static_cast<size_t>(budget + 1);
  return n * (2 * sizeof(double) + kHeapInts * sizeof(int32_t));
}

__global__ void build_kernel(BuildArgs a, bool use_shared) {
  extern __shared__ double smem[];  // [2 * n] doubles, then [kHeapInts * n] int32
  const int64_t b = blockIdx.x, n = a.budget + 1;
  if (threadIdx.x == 0) {
    const RowWork w = use_shared
        ? row_work_at(smem, reinterpret_cast<int32_t*>(smem + 2 * n), n)
        : row_work(a, b);
    finish_row(a, b, build_row(a, b, w));
  } else {
    uint8_t* mask = a.tree_mask + b * n * n;
    for (int64_t j = threadIdx.x - 1; j < n * n; j += blockDim.x - 1) mask[j] = 0;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) mark_ancestors(a, b, i);
}

}  // namespace

int build_cuda(const BuildArgs& a, void* stream) {
  if (a.batch == 0) return 0;
  const size_t bytes = shared_bytes(a.budget);
  const bool use_shared = bytes <= kSharedLimit;
  build_kernel<<<static_cast<unsigned>(a.batch), kThreads, use_shared ? bytes : 0,
                 static_cast<cudaStream_t>(stream)>>>(a, use_shared);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ddtree
}  // namespace specdec
