// Attention over the hierarchical 4-bit KV cache on the CPU, torch-free (shared pieces and
// layouts: quant_attention.h; glue: csrc/ops/quant_attention_cpu.cpp).
#pragma once

#include <cstdint>

#include "kernels/quant_attention/quant_attention.h"

namespace specdec::qattn {

// The (row, KV head) slabs task_begin .. task_end - 1 (task = b * Hkv + h). Each slab's tokens are
// dequantised once, in tiles, and serve all Hq / Hkv query heads times n new tokens of it.
void quant_attention_cpu_tasks(const Args& a, int64_t task_begin, int64_t task_end);

}  // namespace specdec::qattn
