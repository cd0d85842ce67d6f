// Launcher of the attention over the hierarchical 4-bit KV cache on CUDA (torch-free; layouts
// and shared pieces: quant_attention.h; glue: csrc/ops/quant_attention_cuda.cpp).
#pragma once

#include <cuda_runtime.h>

#include "kernels/quant_attention/quant_attention.h"

namespace specdec::qattn {

// Every pointer in `a` on the current device. cudaErrorInvalidValue for shapes the kernel does not
// take (head_dim above 1024, Hq not a multiple of Hkv, more than 65535 query blocks per head).
cudaError_t launch_quant_attention(const Args& a, cudaStream_t stream);

}  // namespace specdec::qattn
