// CUDA launcher of `diffusion_unmask` (torch-free; the glue is csrc/ops/diffusion_cuda.cpp).
// Returns the launch's cudaError_t; nothing synchronises with the host.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/diffusion/unmask.h"

namespace specdec {
namespace diffusion {

// Step 1: one block per (row, position) of the window; step 2: one block per row.
cudaError_t launch_unmask(const UnmaskArgs& a, cudaStream_t stream);

}  // namespace diffusion
}  // namespace specdec
