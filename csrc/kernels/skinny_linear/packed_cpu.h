// y = x · Wᵀ (+ bias) in float32 for the few activation rows of decoding and speculative
// verification, from a weight packed once into column panels, torch-free.
//
// Why a second skinny kernel: a small model's decoding step is bound by streaming its weights
// from the last-level cache. The row-major kernel (skinny_linear_cpu.h) ends each output with a
// horizontal reduction, which costs as much as the multiply-adds when K is a few hundred. Here W
// is stored as panels of kPanel outputs, [ceil(N / kPanel)][K][kPanel]: a panel streams in order,
// each input feature k broadcasts x[m, k] against kPanel weights, and every output keeps its own
// accumulator (no reduction). Panels may hold bfloat16 weights (a bf16 checkpoint's exact values,
// half the bytes), widened exactly to float32 as they stream in.
//
// Batch invariance and portability of bits: y[m, n] is the fused multiply-add chain
// acc = fma(x[m, k], W[n, k], acc) over k = 0 .. K-1 from acc = 0, then + bias[n], whatever the
// other rows of x are and whichever of the three kernels runs (AVX-512, AVX2, or the portable loop
// with std::fma). One-token decoding and a verification forward give a token the same bits. On a
// CPU with AMX, bfloat16 panels run a fourth kernel instead (packed_amx.h): batch-invariant too,
// within float32 rounding of these, but not their bits.
#pragma once

#include <cstdint>
#include <vector>

namespace specdec::skinny {

inline constexpr int64_t kPanel = 64;  // outputs per panel: four 16-lane registers per activation row

// Output panels [p_begin, p_end) of y [M, N] (row-major float32) from x [M, K] and the packed
// weight [ceil(N / kPanel), K, kPanel] (float32, or bfloat16 as raw bits); bias [N] or nullptr.
// Outputs past N in the last panel (its zero padding) are not written.
void packed_linear_cpu_panels(const float* x, int64_t M, int64_t K, const float* packed, const float* bias,
                              float* y, int64_t N, int64_t p_begin, int64_t p_end);

// bfloat16 panels take x prepared once for all the calls over their ranges (threads claiming chunks
// of panels, or vocabulary ranges): on the AMX tier, x's bfloat16 split (packed_amx.h) made into
// `scratch` instead of in every range's call; on the FMA tiers x as it is. Valid while x and scratch
// are.
//
// `rounded` (a prompt's prefill only): on the AMX tier x rounded to nearest bfloat16 instead of
// split exactly (one tile product per weight instead of three; rows still independent of each
// other, but not the bits of the exact split, so never for rows a verification compares with
// decoding); the FMA tiers ignore it.
struct PreparedRowsBf16 {
  const float* x;
  int64_t M, K;
  const uint16_t* amx_parts;  // null off the AMX tier
  int amx_nparts;             // 3 (the exact split) or 1 (rounded)
};
PreparedRowsBf16 prepare_rows_bf16(const float* x, int64_t M, int64_t K, std::vector<uint16_t>& scratch,
                                   bool rounded = false);
void packed_linear_cpu_panels_bf16(const PreparedRowsBf16& rows, const uint16_t* packed, const float* bias, float* y,
                                   int64_t N, int64_t p_begin, int64_t p_end);

// The same without bias into a block of columns: y[m * ldy + n - p_begin * kPanel] for the outputs n
// of panels [p_begin, p_end) (a caller ranking a vocabulary range keeps [M, range] in cache).
void packed_linear_cpu_panels_into(const float* x, int64_t M, int64_t K, const float* packed, float* y, int64_t ldy,
                                   int64_t N, int64_t p_begin, int64_t p_end);
void packed_linear_cpu_panels_into_bf16(const PreparedRowsBf16& rows, const uint16_t* packed, float* y, int64_t ldy,
                                        int64_t N, int64_t p_begin, int64_t p_end);

// "avx512" or "avx2" when a vector kernel runs on this machine, else "portable" (std::fma per
// output: the same bits, far slower; callers use BLAS instead).
const char* packed_linear_cpu_isa();

// The tier bfloat16 panels run: "amx" where the AMX tier is on (packed_amx.h: up to 16 rows for
// the price of one, float32 sums of an exact three-way bfloat16 split of x, again the same bits for
// a row whatever the others are, though not the FMA tiers' bits), else packed_linear_cpu_isa().
const char* packed_linear_cpu_isa_bf16();

}  // namespace specdec::skinny
