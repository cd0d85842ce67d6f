// Attention over the hierarchical 4-bit KV cache on the CPU, torch-free (shared pieces and
// layouts: quant_attention.h; glue: csrc/ops/quant_attention_cpu.cpp).
#pragma once

#include <cstdint>

#include "kernels/quant_attention/quant_attention.h"

namespace specdec::qattn {

// The (row, KV head) slabs task_begin .. task_end - 1 (task = b * Hkv + h). Each slab's tokens are
// dequantised once, in tiles, and serve all Hq / Hkv query heads times n new tokens of it. Runs
// the AVX-512 kernel when the CPU has it and D is a multiple of 16 (unless SPECDEC_CPU_ISA caps
// the ISA at avx2 / baseline), else the portable one.
void quant_attention_cpu_tasks(const Args& a, int64_t task_begin, int64_t task_end);

// The two kernels behind it (quant_attention_cpu.cpp and quant_attention_avx512.cpp); the AVX-512
// one needs D % 16 == 0 and a CPU with AVX-512 F / BW / VL / DQ and FMA
// (quant_attention_avx512_available()).
void quant_attention_portable_tasks(const Args& a, int64_t task_begin, int64_t task_end);
void quant_attention_avx512_tasks(const Args& a, int64_t task_begin, int64_t task_end);
bool quant_attention_avx512_available();

}  // namespace specdec::qattn
