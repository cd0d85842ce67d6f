// Launchers of the CUDA MTP-head kernels (torch-free; the glue is csrc/ops/mtp_cuda.cpp). The
// math is mtp_cpu.h's; the top-k lists are topk.h's, shared with the CPU kernels.
//
// Output side, three launches on `stream`:
//   1. normalise:  xn [M, H] fp32 (fp64 for double) = rms_norm(x) * norm_weight, one block per row;
//   2. scan:       grid (ceil(V / kVocabTile), ceil(M / rows)); a block reads its kVocabTile rows
//                  of lm_head once for `rows` activation rows (a warp per lm_head row, lanes
//                  striding H in 16-byte loads), stages the tile's logits in shared memory,
//                  optionally writes them to `logits`, and keeps each activation row's top-k of
//                  the tile: part_vals / part_idx [parts, M, k];
//   3. merge:      one warp per activation row merges the parts' lists (lanes merge strided
//                  parts, lane 0 merges the 32 lane lists) into values / indices [M, k].
// The [M, V] logits exist only when asked for.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace specdec::mtp {

inline constexpr int kVocabTile = 256;  // lm_head rows per block: 2 MiB at H = 4096 bf16
inline constexpr int kMaxK = 64;        // top-k lists live in registers / local memory

// T: 0 float32, 1 float16, 2 bfloat16, 3 float64 (kernels/common/dtype.h's DType). Acc pointers
// are float for every T but float64 (double). Workspace: xn [M, H] Acc, part_vals [parts, M, k]
// Acc, part_idx [parts, M, k] int64, part_bad [parts, M] uint8 (parts = ceil(V / kVocabTile)).
cudaError_t launch_head_topk(int dtype, const void* x, const void* norm_weight, const void* lm_head, double eps,
                             int64_t M, int64_t H, int64_t V, int k, void* xn, void* part_vals, int64_t* part_idx,
                             uint8_t* part_bad, void* values, int64_t* indices, void* logits, int32_t* status,
                             cudaStream_t stream);

// Input side: en / hn [M, H] Acc workspaces; out [M, H] Acc; status [M] (kStatusDraftTokenOutOfRange
// where tokens[m] lies outside [0, V); that row's out is zero).
cudaError_t launch_mtp_input(int dtype, const void* h, const int64_t* tokens, const void* embed, int64_t V,
                             const void* enorm_weight, const void* hnorm_weight, const void* eh_proj, double eps,
                             int64_t M, int64_t H, void* en, void* hn, void* out, int32_t* status,
                             cudaStream_t stream);

}  // namespace specdec::mtp
