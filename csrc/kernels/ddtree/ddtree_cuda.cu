// CUDA kernel of the DDTree build: one thread block per batch row.
//
// The best-first search is sequential by nature (each pop decides the next push), so thread 0 of
// the block runs it on the row's workspace, the same code as the CPU kernel (ddtree.h); then all
// threads of the block write the (M + 1) x (M + 1) visibility mask, one mask row per thread in
// turn, which is the bulk of the bytes.
#include <cuda_runtime.h>

#include "kernels/ddtree/ddtree.h"

namespace specdec {
namespace ddtree {
namespace {

// 128 threads: the mask of M = 256 has 257 rows, two passes; more threads would mostly idle.
constexpr int kThreads = 128;

__global__ void build_kernel(BuildArgs a) {
  const int64_t b = blockIdx.x;
  if (threadIdx.x == 0) finish_row(a, b, build_row(a, b));
  __syncthreads();
  for (int64_t i = threadIdx.x; i <= a.budget; i += blockDim.x) mask_row(a, b, i);
}

}  // namespace

int build_cuda(const BuildArgs& a, void* stream) {
  if (a.batch == 0) return 0;
  build_kernel<<<static_cast<unsigned>(a.batch), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace ddtree
}  // namespace specdec
