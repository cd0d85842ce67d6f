// The pieces of one Llama/Qwen decoder layer for the few token rows of a decoding or verification
// forward on the CPU, torch-free. The glue (csrc/ops/decoder_layer_cpu.cpp) runs them in order with
// the packed linear (kernels/skinny_linear/packed_cpu.h) between them:
//
//   h = rms_norm(x) ─ qkv = h·Wqkv ─ q/k norm (Qwen3), RoPE, K/V to the cache ─ attention ─ ·Wo ─ + x
//     ─ rms_norm ─ ·Wgate|up ─ silu(gate) * up ─ ·Wdown ─ + residual
//
// Why: a small model's step on a CPU is bound by per-op overhead (about 35 torch ops per layer, a
// few microseconds each), not by arithmetic; one op per layer removes it.
//
// Every row's arithmetic is a fixed sequence on that row's own data (and the cache tokens it may
// see), so a token gets the same bits decoded alone, verified with others, or as a tree node.
// Rows: m = b * n + i (batch row b, new token i at cache slot lengths[b] + i).
#pragma once

#include <cstdint>

namespace specdec::layer {

// out[m, :] = x[m, :] / sqrt(mean(x[m, :]^2) + eps) * weight, for rows [0, M) of width H.
void rms_norm_rows(const float* x, const float* weight, float eps, int64_t M, int64_t H, float* out);

struct AttentionShape {
  int64_t B, n;         // batch rows, new tokens per row
  int64_t Hq, Hkv, D;   // query heads, key/value heads (Hq % Hkv == 0), head dim (even)
  int64_t T;            // cache slots per row
};

// In qkv [M, (Hq + 2 Hkv) * D] (q heads, k heads, v heads per row): RMS-normalise each q and k
// head over D when q_norm / k_norm are given (eps), rotate q and k by RoPE with cos and signed
// sin [M, D] (dimension d paired with d + D/2: x * cos + roll(x, D/2) * sin), and copy each k / v
// head to slot lengths[b] + i of k_cache / v_cache [B, Hkv, T, D].
void rope_and_store(float* qkv, const float* cos, const float* signed_sin, const float* q_norm,
                    const float* k_norm, float eps, float* k_cache, float* v_cache, const int64_t* lengths,
                    const AttentionShape& s);

// Attention of the new tokens' queries (in qkv) over the cache: query i of row b sees slots
// t < lengths[b], and the new tokens at lengths[b] + j with j == i, or j < i without a tree mask,
// or tree_mask[b, i, j] (bool [B, n, n]) with one. out [M, Hq * D]. Work items are (b, q head)
// pairs, item = b * Hq + h; this call does items [begin, end).
void attend(const float* qkv, const float* k_cache, const float* v_cache, const int64_t* lengths,
            const bool* tree_mask, float sm_scale, const AttentionShape& s, float* out, int64_t begin,
            int64_t end);

// act[m, j] = silu(gate_up[m, j]) * gate_up[m, I + j] for rows [0, M), j < I.
void silu_mul_rows(const float* gate_up, int64_t M, int64_t I, float* act);

}  // namespace specdec::layer
