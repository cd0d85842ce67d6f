// GGUF matmul for a prompt's prefill on AMX CPUs: y[M, N] = x[M, K] · Wᵀ with x rounded to
// bfloat16 and W's blocks dequantised to bfloat16, multiplied on AMX tiles (TDPBF16PS), float32
// accumulation. Torch-free.
//
// Why a second kernel: the decoding kernels (q8.h, gguf_cpu.h) keep every row's bits independent of
// the other rows by doing each row's integer or float dot products on vector units, which costs
// ~13 ms per row of the 1.5B at 2 threads: a 168-token prompt took 1.9 s, a third of a 64-token
// call, while a one-token step takes 60 ms. A tile product multiplies 16 rows by 16 outputs over 32
// k in one instruction, so a prompt costs about one pass of weight decoding plus the tile products.
//
// The numeric contract is its own, not the decoding kernels': for output y[m, n],
//   w[k] = bf16(dequant(W)[n, k])   (blocks.h's float32 value, rounded to nearest even)
//   a[k] = bf16(x[m, k])            (rounded to nearest even)
//   y    = the hardware's float32 sum of the products a[k] w[k], 32 k per instruction, k in order
// which depends on row m of x and row n of W alone (the same for any M, thread count or range), so
// it is deterministic and batch invariant, but it is not the bits of the decoding kernels' one-row
// forward. Callers use it only where every decoding method runs it alike: the prompt's prefill
// (LlamaModel.forward(prefill=True)), never a verification forward, so greedy speculative output
// still equals autoregressive output token for token.
#pragma once

#include <cstdint>

namespace specdec::gguf {

// AMX-BF16 usable on this CPU, by this process, SPECDEC_CPU_ISA allowing it (packed_amx.h's check).
bool bf16_amx_enabled();

// x's prepared form: uint16 elements (bfloat16 bits) of bf16_amx_prepare's output for M rows of K.
int64_t bf16_amx_rows_size(int64_t M, int64_t K);

// xv = x [M, K] (row-major float32, K a multiple of 32) rounded to bfloat16 in the tiles' layout:
// blocks of 16 rows (their count rounded up to even, missing rows zero), each [K / 32 chunks][16
// k-pairs][16 rows][2]: element ((b * K / 32 + c) * 16 + p) * 32 + 2 r + j = x[16 b + r, 32 c + 2 p + j].
void bf16_amx_prepare(const float* x, int64_t M, int64_t K, uint16_t* xv);

// y[m * ldy + n] for n in [n_begin, n_end), m in [0, M), from xv (bf16_amx_prepare of M rows) and
// the weight's blocks (N rows of K / QK blocks of `type`, one of blocks.h's Type ids). Needs
// bf16_amx_enabled().
void matmul_bf16_amx_rows(int32_t type, const uint16_t* xv, int64_t M, int64_t K, const uint8_t* weight, float* y,
                          int64_t ldy, int64_t n_begin, int64_t n_end);

// The same products over a weight in panels of 16 rows (panels.h; `type` one of its panel types),
// bit for bit those of matmul_bf16_amx_rows on the file's blocks (bf16_amx_panels.cpp: W is the B
// operand there, so x goes in as rows). xr: bf16_amx_prepare_panel_rows of M rows. Rows [n_begin,
// n_end) of y may start and end inside a group of 16.
int64_t bf16_amx_panel_rows_size(int64_t M, int64_t K);

// xr = x [M, K] rounded to bfloat16 as A tiles: blocks of 16 rows (their count rounded up to even,
// missing rows zero), each [K / 32 chunks][16 rows][32 k]: element ((b * K / 32 + c) * 16 + r) *
// 32 + j = x[16 b + r, 32 c + j].
void bf16_amx_prepare_panel_rows(const float* x, int64_t M, int64_t K, uint16_t* xr);

void matmul_bf16_amx_panel_rows(int32_t type, const uint16_t* xr, int64_t M, int64_t K, const uint8_t* weight, float* y,
                                int64_t ldy, int64_t n_begin, int64_t n_end);

}  // namespace specdec::gguf
