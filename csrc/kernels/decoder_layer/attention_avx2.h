// The decoder layer's attention as an AVX2 + FMA kernel, for x86-64 machines without AVX-512
// (decoder_layer_cpu.cpp picks it at run time below attention_avx512.h, for head dims it handles;
// the portable loop covers the rest).
//
// The same algorithm as attention_avx512.h in 8-lane vectors, per (batch row b, query head h) work
// item over the n new tokens' queries q_i [D]: scores s_r = (q_i · k_slot(r)) * sm_scale over the
// visible slots in rank order (the committed prefix, then the new tokens query i may see), one
// 8-lane fma chain over D and a fixed reduction; p_r = exp(s_r - max_r s_r) (exp_avx2.h), total =
// sum_r p_r in 8 lane partial sums by r % 8; out_i = (sum_r p_r v_slot(r), one fma chain per output
// lane in rank order) * (1 / total). A query's arithmetic depends only on its own visible (k, v)
// sequence, so a token gets the same bits decoded alone, verified in a chain, or verified as a
// tree node whose accepted ancestors were compacted afterwards.
#pragma once

#include <cstdint>

#include "kernels/decoder_layer/decoder_layer_cpu.h"

namespace specdec::layer {

// True when this build and machine run the AVX2 kernel for head dim D (a multiple of 8, <= 128)
// and SPECDEC_CPU_ISA allows it.
bool attend_avx2_supports(int64_t D);

// As attend() in decoder_layer_cpu.h: work items item = b * Hq + h, this call does [begin, end).
void attend_avx2(const float* qkv, const float* k_cache, const float* v_cache, const int64_t* lengths,
                 const bool* tree_mask, float sm_scale, const AttentionShape& s, float* out, int64_t begin,
                 int64_t end);

}  // namespace specdec::layer
