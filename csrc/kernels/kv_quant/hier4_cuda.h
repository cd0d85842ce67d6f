// Launchers of the hierarchical 4-bit KV-cache kernels (torch-free; glue: ops/kv_quant_cuda.cpp).
// Shapes and storage: python/specdec_cuda/reference/kv_quant.py; per-group math: hier4.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/dtype.h"

namespace specdec::kv {

// x: [B, H, T, D] block (dtype float32 / float16 / bfloat16); start: [B] int64 device array, a
// row whose block does not fit (start < 0, start + T > capacity, or for keys start % G != 0) is
// skipped. upper / lower: [B, H, capacity, D/2]; keys: scale / zero [B, H, capacity/G, D];
// values: scale / zero [B, H, capacity, D/G].
cudaError_t launch_quantize_keys(const void* k, DType dtype, const int64_t* start, int64_t B, int64_t H, int64_t T,
                                 int64_t D, int64_t capacity, int64_t G, uint8_t* upper, uint8_t* lower, float* scale,
                                 float* zero, cudaStream_t stream);
cudaError_t launch_quantize_values(const void* v, DType dtype, const int64_t* start, int64_t B, int64_t H, int64_t T,
                                   int64_t D, int64_t capacity, int64_t G, uint8_t* upper, uint8_t* lower, float* scale,
                                   float* zero, cudaStream_t stream);

// out: [B, H, T, D] in out_dtype (float32 / float16 / bfloat16; aligned to two elements), tokens
// [0, T) of the cache. keys: true for key grouping.
cudaError_t launch_dequantize(bool keys, const uint8_t* upper, const uint8_t* lower, const float* scale,
                              const float* zero, int64_t B, int64_t H, int64_t T, int64_t D, int64_t capacity,
                              int64_t G, bool use_lower, void* out, DType out_dtype, cudaStream_t stream);

}  // namespace specdec::kv
