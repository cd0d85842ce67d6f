// GGUF k-quant matmul for a prompt's prefill on CPUs without AMX ("Q8K activations"), torch-free:
// x rounded to int8 with one scale per 256 values (llama.cpp's Q8_K layout of the same name), the
// sub-block scales of the weight applied in integers, one float step per super-block and output.
//
// Why a third kernel: the decoding kernels (q8.h) keep q8.h's float order, two float steps per
// 32 weights and row of x, whose multiplies share the vector units with the integer dot products:
// their multi-row tiles reach ~35-43% of a Zen 4 core's vpdpbusd rate (bench/bench_int8_peak.py).
// With 16 rows of W in the vector lanes and the scales in integers, a row of x costs 64 vpdpbusd
// and ~25 other steps per 16 outputs' super-block instead of 64 and ~80: the 1.5B's 168-token
// prompt 2.61 -> 1.59 s on a 2-core Zen 4 EPYC (in one process, against the decoding kernels).
//
// ---- The activation format ------------------------------------------------------------------------
// A row of K values (K a multiple of 256, T = K / 256 super-blocks) is q8k_row_bytes(K) bytes:
//   offset        type      count    what
//   0             int8      K        q[k]
//   K             float32   T        d[t], super-block t's scale
//   K + 4 T       int16     K / 16   s[h] = q[16h] + ... + q[16h + 15]
//   ..            zero      ..       padding to a multiple of 64 bytes
// Quantising super-block t (v = x[256t .. 256t + 255]): amax = max |v_i| (exact); d = amax / 127
// (one float32 division); q_i = 0 if d == 0, else clamp(rne(v_i / d), -127, 127) (a division per
// value, as q8.h's groups; NaN gives 0).
//
// ---- The float order -----------------------------------------------------------------------------
// Output y[m, n], A = 0 (float32), for each super-block t in order, dx = d[t] of row m, integers
// exact (int32), fp16 widened exactly, mul = one rounded float32 product, fma / fnma rounded once:
//   Q4_K  S = Σ_j sc_j Σ_{k in sub-block j (32)} w_k q_k       M = Σ_j m_j (s[2j'] + s[2j' + 1])
//         A = fma(float(S), mul(d, dx), A);  A = fnma(float(M), mul(dmin, dx), A)
//   Q6_K  S = Σ_j sc_j (Σ_{k in sub-block j (16)} w_k q_k - 32 s[j'])   (w_k the code, 0..63)
//         A = fma(float(S), mul(d, dx), A)
//   y = A
// where j' indexes x's 16-value sums of the sub-block (Q4_K: 2 per sub-block). float() rounds to
// nearest even (|S| < 2^31: Q4_K <= 63 * 15 * 127 * 256, Q6_K <= 128 * 2 * 63 * 127 * 256).
// It depends on row m of x and row n of W alone, so it is batch invariant and deterministic, but it
// is not q8.h's: a model whose k-quants are in the file's (or the lane) order uses it for a prompt's
// prefill only (LlamaModel.forward(prefill=True)), as the AMX tiles' contract (bf16_amx.h), never
// for rows a verification compares with decoding. A model whose k-quants are panels (panels.h:
// where the VNNI tier runs) decodes and verifies in it too (ops/gguf_linear.h, mode Q8K + Q8): read
// from panels the kernel runs at every row count, a one-token step at the Q8 kernel's speed and a
// verification's extra rows at a third of their cost (bench/bench_real_step.py). Q4_K_LANES /
// Q6_K_LANES / Q4_K_PANELS / Q6_K_PANELS weights give the same values as the file's order.
//
// ---- The legacy formats (Q8_0, Q5_0, Q4_1) ---------------------------------------------------------
// Their fp16 scale per 32 weights allows no integer step across blocks, and their rows (the 0.5B's
// 896) need not be whole super-blocks, so in the same prefill mode they multiply x's Q8 form
// (q8.h: int8 per 32 values) with the same 16-rows-in-lanes tiling, one float step per block:
//   Output y[m, n], A = 0 (float32), for each group g of 32 in order, dx = d[g] of row m, q its
//   codes, the integers and products as q8.h's (kernels/gguf/legacy_group.h):
//   Q8_0  A = fma(float(Σ w q), mul(d_w, dx), A)
//   Q5_0  A = fma(float(Σ (w - 16) q), mul(d_w, dx), A)
//   Q4_1  A = fma(float(Σ w q), mul(d_w, dx), A);  A = fma(float(Σ q), mul(m_w, dx), A)
//   y = A
// q8.h's integers in one accumulator instead of its eight lanes: again row-independent and batch
// invariant, again a prefill-only contract (figures: docs/cpu-path.md#prefill). The kernel
// (legacy_lanes_avx512_vnni.cpp) reads the file's rows or their panels (panels.h); from panels it
// also runs q8.h's own order, for decoding.
#pragma once

#include <cstdint>

namespace specdec::gguf {

// Whether the Q8K kernel multiplies this weight type (the k-quants and their lane-order and panel
// layouts).
bool q8k_supported(int32_t type);

// Bytes of one Q8K activation row of K values (K a multiple of 256).
int64_t q8k_row_bytes(int64_t K);

// xk [M, q8k_row_bytes(K)] = the Q8K activations of x [M, K] (row-major float32), padding zeroed.
void quantize_rows_q8k(const float* x, int64_t M, int64_t K, uint8_t* xk);

// y[m * ldy + n] for n in [n_begin, n_end), m in [0, M), from xk (quantize_rows_q8k) and the
// weight's blocks (N rows of K / 256 blocks of `type`, q8k_supported; panels: any range of rows,
// the groups holding them read whole), in the float order above.
void matmul_q8k_rows(int32_t type, const uint8_t* xk, int64_t M, int64_t K, const uint8_t* weight, float* y,
                     int64_t ldy, int64_t n_begin, int64_t n_end);

// Whether the legacy Q8K matmul multiplies this weight type (Q8_0, Q5_0, Q4_1).
bool q8k_legacy_supported(int32_t type);

// y[m * ldy + n] for n in [n_begin, n_end), m in [0, M), from xq (q8.h's quantize_rows_q8 of x,
// K a multiple of 32) and the weight's blocks (q8k_legacy_supported), in the legacy order above.
void matmul_q8k_legacy_rows(int32_t type, const uint8_t* xq, int64_t M, int64_t K, const uint8_t* weight, float* y,
                            int64_t ldy, int64_t n_begin, int64_t n_end);

}  // namespace specdec::gguf
