// Launchers of the CUDA GGUF kernels (torch-free; the glue is csrc/ops/gguf_cuda.cpp). The weight
// is the file's blocks (blocks.h): N rows of K / QK blocks, 2-byte aligned; K a multiple of QK;
// type a supported GGML type id (the glue checks all three).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace specdec::gguf {

enum class Elem : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// out[N, K] (row-major, `dtype`) = dequant(W), each value rounded once from blocks.h's float32.
cudaError_t launch_gguf_dequantize(int32_t type, const uint8_t* weight, int64_t N, int64_t K, void* out, Elem dtype,
                                   cudaStream_t stream);

// y[M, N] = x[M, K] · dequant(W)ᵀ (x, y row-major of `dtype`; float32 accumulation, y rounded once).
// For the few rows of decoding and verification: one warp per row of W, every M row of x against
// it; each output's accumulation order depends only on K.
cudaError_t launch_gguf_matmul(int32_t type, const void* x, int64_t M, int64_t K, const uint8_t* weight, void* y,
                               int64_t N, Elem dtype, cudaStream_t stream);

}  // namespace specdec::gguf
