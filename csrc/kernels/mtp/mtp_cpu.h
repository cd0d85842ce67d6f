// The fused MTP-head ops on the CPU, torch-free (reference: python/specdec_cuda/reference/mtp.py).
//
// Output side, per activation row m of x [M, H]:
//   xn = rms_norm(x[m]) * norm_weight                       (Acc precision, once per row)
//   logit[v] = <xn, lm_head[v]>  for v in [0, V)            (never stored unless asked)
//   top-k of the logits, ties to the lower index             (values descending)
// The vocabulary is cut into ranges that threads scan independently (each lm_head row is read
// once for all M activation rows), each range keeps its own top-k per row, and the ranges' lists
// are merged at the end: the [M, V] logits never exist in memory.
//
// Input side (DeepSeek-V3 MTP module input), per row m:
//   out[m] = eh_proj[:, :H] · rms_norm(embed[tokens[m]]) * enorm
//          + eh_proj[:, H:] · rms_norm(h[m]) * hnorm
// with the two halves of eh_proj [H, 2H] read through two pointers: the [2H] concatenation is
// never built.
//
// T: the storage type (float, double, Half16, BFloat16); Acc: float, or double for T = double.
#pragma once

#include <cstdint>

#include "kernels/skinny_linear/packed_cpu.h"

namespace specdec::mtp {

// xn [M, H] = rms_norm(x [M, H]) * weight [H], in Acc.
template <typename T, typename Acc>
void rms_normalize_rows(const T* x, const T* weight, double eps, int64_t M, int64_t H, Acc* xn);

// Scan vocabulary rows [v_begin, v_end): per activation row m keep its top-k in
// vals/idx [M, k] (n [M] entries held, start at 0), flag non-finite logits in nonfinite [M],
// and write logits [M, V] (row stride V) when `logits` is not null.
template <typename T, typename Acc>
void head_topk_range(const Acc* xn, int64_t M, int64_t H, const T* lm_head, int64_t V,
                     int64_t v_begin, int64_t v_end, int k, Acc* vals, int64_t* idx, int* n,
                     uint8_t* nonfinite, Acc* logits);

// Logits of vocabulary rows [v_begin, v_end) into scratch [M, v_end - v_begin] (kept in cache
// while rank_logits_block ranks them), from a 4-bit LM head in the quant family's LAYOUT_CPU
// (kernels/quant/w4_cpu.h; packed [ceil(V/16), H/2, 16] uint8, scales [ceil(V/16), H/group, 16]
// float32) through the W4A16 tile kernel. v_begin must be a multiple of 16 (a weight tile).
void head_logits_w4_range(const float* xn, int64_t M, int64_t H, const uint8_t* packed, const float* scales,
                          int64_t group, int64_t v_begin, int64_t v_end, float* scratch);

// The same from an LM head packed in column panels for the CPU decoding path (the layout of
// kernels/skinny_linear/packed_cpu.h: [ceil(V/64), H, 64], float32, or bfloat16 raw bits when
// `bf16_rows` is given: xn prepared once for every range by skinny::prepare_rows_bf16, which on the
// AMX tier splits it, instead of in each of the ~600 ranges of a 151,936-id head) through the
// packed kernel. v_begin must be a multiple of the 64-row panel.
void head_logits_packed_range(const float* xn, int64_t M, int64_t H, const void* panels,
                              const skinny::PreparedRowsBf16* bf16_rows, int64_t V, int64_t v_begin, int64_t v_end,
                              float* scratch);

// The epilogue over a block of logits, scores [M, width] for vocabulary ids v0 .. v0 + width - 1:
// flags non-finite rows in nonfinite [M], copies into logits [M, V] when not null, and keeps each
// row's top-k in vals / idx [M, k] (n [M] entries held).
void rank_logits_block(const float* scores, int64_t M, int64_t width, int64_t v0, int64_t V, int k, float* vals,
                       int64_t* idx, int* n, uint8_t* nonfinite, float* logits);

// Per row m of a block of logits scores [M, width]: its largest value in mx[m] and
// Σ_j e^(scores[m, j] - mx[m]) in se[m], the pieces merge_lse combines over the vocabulary's
// ranges (a log-sum-exp in one pass over logits still in cache, instead of a log-softmax over the
// [M, V] logits afterwards). Values are undefined on rows with a non-finite logit (flagged anyway).
void block_max_sumexp(const float* scores, int64_t M, int64_t width, float* mx, float* se);

// lse[m] = log Σ over the parts p of se[p, m] e^(mx[p, m]) (laid out [parts, M]), computed as
// max_p mx + log Σ_p se e^(mx - max): each row's log-sum-exp over the whole vocabulary.
void merge_lse(const float* mx, const float* se, int64_t parts, int64_t M, float* lse);

// Merge `parts` partial lists (part p: vals/idx [M, k], n [M], laid out [parts, M, ...]) into
// out_vals / out_idx [M, k]; rows with fewer than k candidates (V < k cannot happen: checked by
// the glue) are not left short.
template <typename Acc>
void merge_topk(const Acc* vals, const int64_t* idx, const int* n, int64_t parts, int64_t M, int k,
                Acc* out_vals, int64_t* out_idx);

// Output rows [o_begin, o_end) of the input side: out [M, H] (Acc), from en / hn [M, H] (the
// normalised embedding and hidden rows) and eh_proj [H, 2H].
template <typename T, typename Acc>
void eh_proj_range(const Acc* en, const Acc* hn, int64_t M, int64_t H, const T* eh_proj,
                   int64_t o_begin, int64_t o_end, Acc* out);

// en [M, H] = rms_norm(embed[tokens[m]]) * weight; returns the first row whose token lies
// outside [0, V), or -1.
template <typename T, typename Acc>
int64_t gather_normalize_rows(const int64_t* tokens, const T* embed, int64_t V, const T* weight,
                              double eps, int64_t M, int64_t H, Acc* en);

}  // namespace specdec::mtp
