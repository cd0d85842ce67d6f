// CUDA launchers of the sampling family (torch-free; the glue is csrc/ops/sampling_cuda.cpp).
// Each returns the launch's cudaError_t; nothing synchronises with the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/sampling/chain.h"
#include "kernels/sampling/filter.h"

namespace specdec {
namespace sampling {

// sample: one block per row.
cudaError_t launch_sample(const SampleArgs& a, cudaStream_t stream);

// Statistics of a deferred rejection (parallel strategy): the target's and the draft's
// distribution at that position, for the residual race run after the walk.
struct PositionStats {
  RowDist target, draft;
};

// Token value marking "rejected here, residual race pending" between the parallel kernels.
constexpr int64_t kResidualPending = -2;

// Device workspace (bytes) the parallel strategy needs: one PositionResult and one PositionStats
// per target row; the serial strategy needs none.
size_t verify_chain_workspace_bytes(int64_t num_drafts, int64_t batch);

// verify_chain. parallel: one block per target logit row (every (row, position) at once) deciding
// its position alone; one thread per row walking the decisions; one block per row whose walk
// stopped at a rejection running the residual race there. serial: one block per row walking its
// positions, stopping at the first rejection (a rejected tail is never read).
cudaError_t launch_verify_chain(const VerifyArgs& a, bool parallel, void* workspace,
                                cudaStream_t stream);

}  // namespace sampling
}  // namespace specdec
