// Internal to the packed-panel skinny linear (packed_cpu.h): its AMX tier for bfloat16 panels.
//
// Why: on the FMA tiers every activation row costs its own multiply-adds, so past ~6 rows a
// verification forward is bound by arithmetic, not by the weight stream (16 rows cost ~2 one-row
// steps on a 2-core Xeon). AMX's TDPBF16PS multiplies a 16-row tile of activations by a 32 x 16
// tile of weights in one instruction, so up to 16 rows cost what one row costs: the weight stream.
//
// The numeric contract differs from the FMA tiers' (one float32 fma chain per output), and is
// again the same for a row whatever the other rows are (batch invariance, the property greedy
// exactness needs): each float32 activation x is split exactly into three bfloat16 numbers,
// x = hi + lo + lo2 (hi = x with its low 16 bits cleared, lo the same of x - hi, lo2 = x - hi - lo,
// all exact), so every product with a bfloat16 weight is exact; a row's sums are the hardware's
// float32 accumulation of those products, 32 k at a time, in a fixed order (per 32-k chunk: the hi
// products, then lo, then lo2), which depends on that row alone. Results agree with the FMA tiers
// to float32 rounding (the tests bound it), not bit for bit: a machine with AMX and one without
// decode a bfloat16 model to slightly different bits, each consistently.
#pragma once

#include <cstdint>

namespace specdec::skinny {

// AMX-BF16 (with AVX-512 BW for the weight interleave) on this CPU, SPECDEC_CPU_ISA allowing it
// (unset or "avx512"), and the kernel's permission to use the tile registers granted (Linux
// arch_prctl(ARCH_REQ_XCOMP_PERM)). Read once, at load.
bool packed_amx_enabled();

// The same contract as packed_cpu.cpp's tiers for bfloat16 panels [ceil(N / 64), K, 64], in two
// halves, since callers run one x over many panel ranges (one per claimed chunk of threads, or per
// vocabulary range): x's split, [ceil(M / 16)][3][16][Kp] bfloat16 bits (Kp = K rounded up to 32;
// packed_amx_split_size elements), made once (packed_amx_split), then read by every range's call,
// which writes output panels [p_begin, p_end) of y[m * ldy + n - y_col0] (+ bias[n] when bias is not
// null). Splitting in each range's call instead cost as much as the tile products at 96 rows
// (gate|up: 28 ranges). packed_cpu.h's prepare_rows_bf16 is the entry.
//
// nparts 1 instead (a prompt's prefill only, never a verification: see packed_cpu.h): x rounded to
// nearest bfloat16, one product per weight, a third of the tile work; the layout as above with one
// part per row block.
int64_t packed_amx_split_size(int64_t M, int64_t K, int nparts = 3);
void packed_amx_split(const float* x, int64_t M, int64_t K, uint16_t* parts, int nparts = 3);
void packed_panels_amx_bf16_split(const uint16_t* parts, int nparts, int64_t M, int64_t K, const uint16_t* packed,
                                  const float* bias, float* y, int64_t ldy, int64_t y_col0, int64_t N, int64_t p_begin,
                                  int64_t p_end);

}  // namespace specdec::skinny
