// CPU passes over one logit row, shared by the CPU kernels of sample / verify_chain
// (sampling_cpu.cpp) and verify_tree (tree/tree_cpu.cpp): one implementation of the decode, the
// top-k / top-p thresholds (filter.h's radix select) and the two races (distribution.h) on the CPU.
//
// A row is first decoded once into a float32 buffer s [vocab] (s = float(l) / T; T = 1 for greedy,
// where the division is exact); every later pass reads s.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/common/philox.h"
#include "kernels/sampling/filter.h"

namespace specdec {
namespace sampling {
namespace cpu {

// s[i] = float(row[i]) / temperature, i < vocab; `row` points at the row's first logit of `dtype`.
void decode_row(const void* row, DType dtype, int64_t vocab, float temperature, float* s);

// `base` advanced by `elements` logits of `dtype` (the start of a row inside a logit tensor).
const void* offset_pointer(const void* base, DType dtype, int64_t elements);

struct RowScan {
  float max;  // max of s (NaN never wins)
  bool bad;   // NaN or +inf somewhere
};
RowScan scan_row(const float* s, int64_t n);

// Index of the first element equal to `value` (0 when none).
int64_t first_index_of(const float* s, int64_t n, float value);

// The filter of a decoded row under top-k / top-p (filter.h); false when the row is unusable. With
// need_probs false and top-p off, Z is not computed (inv_z 0; a race needs no normaliser). When
// `entropy` is given it receives H(p). `scratch` is reused between calls (candidate lists).
bool build_dist(const float* s, int64_t vocab, int64_t top_k, float top_p, bool need_probs,
                RowDist& d, float* entropy, std::vector<float>& scratch);

// Gumbel race argmax_i s_i + G_i over the kept elements, pruned exactly.
int64_t race(const float* s, int64_t n, const RowDist& d, const RandomStream& stream);

// Residual race argmax_i r_i / E_i over r_i > 0, pruned exactly; rmax = max_i r_i > 0.
int64_t residual_race(const float* r, int64_t n, float rmax, const RandomStream& stream);

// r_i = max(0, p_i - q_i) (or p_i itself when `use_p`) from two decoded rows and their filters;
// returns max_i r_i.
float residual_fill(const float* st, const RowDist& dt, const float* sq, const RowDist& dq,
                    int64_t n, bool use_p, float* r);

}  // namespace cpu
}  // namespace sampling
}  // namespace specdec
