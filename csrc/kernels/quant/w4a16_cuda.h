// Launchers of the CUDA W4A16 kernels (torch-free; the glue is csrc/ops/quant_cuda.cpp).
//
// LAYOUT_CUDA (python/specdec_cuda/reference/quant.py, bit by bit): the weight in tensor-core
// fragment order for mma.m16n8k16 (weight = operand B), with a dtype-dependent nibble interleave:
//   packed int32 [ceil(N/8), ceil(K/128), 128]: word 4*lane + w of (tile nt, chunk c), lane = 4g + t,
//          holds the codes of row 8nt + g at k = 128c + 32t + 8w + j, nibble p holding j = order[p],
//          order = {0,2,4,6,1,3,5,7} for fp16 activations, {0,4,1,5,2,6,3,7} for bf16;
//   scales [ceil(N/8), K/group, 8] in the activation dtype (scales[nt, grp, g] = row 8nt + g).
// Code u means (u - 8) * scale; padding codes are 8, padding scales 0. K and group are multiples
// of 32 (checked by the glue); the packed tensor must be 16-byte aligned, scales 4-byte aligned,
// x rows 16-byte aligned (K % 32 == 0 makes every row start aligned if x is).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace specdec::quant {

enum class ActDType : int { kFloat16 = 0, kBFloat16 = 1 };

inline constexpr int64_t kCudaTileN = 8;     // output rows per mma n8 tile (reference CUDA_TILE_N)
inline constexpr int64_t kCudaChunkK = 128;  // input features per 16-byte lane load (CUDA_CHUNK_K)

// Activation rows one launch of the tensor-core kernel takes at most (the mma's 16-row A tile);
// the glue loops over 16-row slices of larger M, and goes through a dense weight and cuBLAS from
// a threshold on.
inline constexpr int64_t kMmaMaxM = 16;

// One launch configuration of the tensor-core kernel (w4a16_cuda.cu's table lists them).
struct W4MmaTuning {
  int rows;     // activation rows it takes: 1, 8 or 16 (a launch needs M <= rows)
  int tiles_n;  // n8 tiles (8 output columns each) per block
  int stages;   // 128-feature chunks in flight per warp
  int warps;    // warps per block; they split K
};
int w4a16_mma_tuning_count();
W4MmaTuning w4a16_mma_tuning(int index);  // {0, 0, 0, 0} for an index outside the table
int w4a16_mma_auto_tuning(int64_t M);      // the entry the automatic choice launches for M rows

// y[M, N] = x[M, K] · dequant(W)ᵀ (x, y, scales: fp16 or bf16 per `dtype`; fp32 accumulation;
// each weight is rounded to `dtype` once, as dequant(W) is). ldx / ldy: row strides of x / y in
// elements (ldx % 8 == 0, ldy >= N). 1 <= M <= rows of the tuning used: table entry `tuning`, or
// the automatic one for tuning < 0. Returns cudaErrorInvalidValue on a shape, alignment or
// tuning the kernel cannot take.
cudaError_t launch_w4a16_mma(const void* x, int64_t ldx, const int32_t* packed, const void* scales, void* y,
                             int64_t ldy, int64_t M, int64_t N, int64_t K, int64_t group, ActDType dtype,
                             cudaStream_t stream, int tuning = -1);

// weight[N, K] = dequant(W) rounded to `dtype` (row-major, contiguous).
cudaError_t launch_w4_dequantize(const int32_t* packed, const void* scales, void* weight, int64_t N, int64_t K,
                                 int64_t group, ActDType dtype, cudaStream_t stream);

}  // namespace specdec::quant
