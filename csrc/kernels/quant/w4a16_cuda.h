// Launchers of the CUDA W4A16 kernels (torch-free; the glue is csrc/ops/quant_cuda.cpp).
//
// LAYOUT_CUDA (python/specdec_cuda/reference/quant.py): packed int32 [N, K/8], nibble j of word
// (n, c) = code[n, 8c + j], code u meaning (u - 8) * scale; scales [N, K/group] in the activation
// dtype. K and group are multiples of 32 (checked by the glue).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace specdec::quant {

enum class ActDType : int { kFloat16 = 0, kBFloat16 = 1 };

// Activation rows the GEMV kernel takes per launch; the glue splits larger M into launches of
// at most this many rows, or goes through a dense weight and cuBLAS from kDenseFromM on.
inline constexpr int64_t kGemvMaxM = 16;

// y[M, N] = x[M, K] · dequant(W)ᵀ (x, y, scales: fp16 or bf16 per `dtype`; fp32 accumulation).
// ldy: row stride of y (>= N). Returns cudaErrorInvalidValue on a shape the kernel cannot take.
cudaError_t launch_w4a16_gemv(const void* x, const int32_t* packed, const void* scales, void* y, int64_t M,
                              int64_t N, int64_t K, int64_t group, int64_t ldy, ActDType dtype,
                              cudaStream_t stream);

// weight[N, K] = dequant(W) in `dtype`.
cudaError_t launch_w4_dequantize(const int32_t* packed, const void* scales, void* weight, int64_t N, int64_t K,
                                 int64_t group, ActDType dtype, cudaStream_t stream);

}  // namespace specdec::quant
