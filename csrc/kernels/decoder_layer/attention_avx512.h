// The decoder layer's attention as an AVX-512 kernel (decoder_layer_cpu.cpp picks it at run time
// for head dims it handles; the portable loop covers the rest).
//
// Why its own kernel: the portable loop computes one score at a time and calls libm's expf per
// score; a decoding step over a few hundred cached tokens then spends most of its time there
// (for the zoo target, verifying 5 tokens over 300 cached ones: about 0.65 ms of a 1.6 ms forward).
//
// Per (batch row b, query head h) work item, over the n new tokens' queries q_i [D]:
//   visible slots of query i, in rank order: the committed prefix 0 .. lengths[b] - 1, then the new
//   tokens j it may see (j <= i causal, or tree_mask[b, i, j], and itself), in increasing j;
//   s_r = (q_i · k_slot(r)) * sm_scale, one 16-lane fma chain over D and a fixed reduction;
//   p_r = exp(s_r - max_r s_r) (vector exp), total = sum_r p_r in 16 lane partial sums by r % 16;
//   out_i = (sum_r p_r v_slot(r), one fma chain per output lane in rank order) * (1 / total).
// Each query's arithmetic depends only on its own visible (k, v) sequence in rank order: the same
// bits whether a token is decoded alone, verified with others in a chain, or verified as a tree node
// whose accepted ancestors were compacted to contiguous slots afterwards. The committed prefix is
// shared: each cached key and value is loaded once for all n queries of the item.
#pragma once

#include <cstdint>

#include "kernels/decoder_layer/decoder_layer_cpu.h"

namespace specdec::layer {

// True when this build and machine run the vector kernel for head dim D (a multiple of 16, <= 128).
bool attend_avx512_supports(int64_t D);

// As attend() in decoder_layer_cpu.h: work items item = b * Hq + h, this call does [begin, end).
void attend_avx512(const float* qkv, const float* k_cache, const float* v_cache, const int64_t* lengths,
                   const bool* tree_mask, float sm_scale, const AttentionShape& s, float* out, int64_t begin,
                   int64_t end);

}  // namespace specdec::layer
