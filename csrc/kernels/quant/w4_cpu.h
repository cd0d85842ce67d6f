// W4A16 matmul on the CPU, torch-free: y = x · dequant(W)ᵀ with W in LAYOUT_CPU.
//
// LAYOUT_CPU (see python/specdec_cuda/reference/quant.py): output rows in tiles of 16,
//   packed [tiles, K/2, 16] uint8, byte (t, p, j) = code[16t+j, 2p] | code[16t+j, 2p+1] << 4
//   scales [tiles, K/group, 16] float32, code c means (c - 8) * scale.
// A 16-byte row of `packed` is two input features of one tile: zero-extend to 16 int32 lanes,
// then `& 15` and `>> 4` give both without shuffles; the 16 lanes are 16 output rows, so the
// accumulators never need a horizontal sum and each dequantised vector is reused for every
// activation row (M) of the block.
#pragma once

#include <cstdint>

namespace specdec::quant {

inline constexpr int kCpuTileN = 16;

// One range of tiles. x: [M, K] float32 row-major; y: [M, N] float32 row-major (columns of rows
// in the padding of the last tile are not written). group: input features per scale (divides K,
// a multiple of 4). Runs the AVX-512 kernel when the CPU has it, else an AVX2 / baseline one.
void w4a16_matmul_cpu_tiles(const float* x, int64_t M, int64_t K, const uint8_t* packed,
                            const float* scales, int64_t group, float* y, int64_t N,
                            int64_t tile_begin, int64_t tile_end);

// Dense float32 weight [N, K] from LAYOUT_CPU (for large M, which goes through BLAS), tiles
// [tile_begin, tile_end).
void w4_dequantize_cpu_tiles(const uint8_t* packed, const float* scales, int64_t K, int64_t group,
                             float* weight, int64_t N, int64_t tile_begin, int64_t tile_end);

// Which kernel the dispatcher picked: "avx512", "avx2" or "baseline" (reported by the bench).
const char* w4a16_cpu_isa();

}  // namespace specdec::quant
