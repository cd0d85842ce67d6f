// y [M, N] = x [M, K] · Wᵀ (+ bias) from a packed weight tensor (float32 or bfloat16 panels, see
// kernels/skinny_linear/packed_cpu.h), the panels split over torch's threads: what the
// skinny_linear_packed op and the decoder_layer op both run. The caller has checked the shapes.
#pragma once

#include "ops/aten.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/skinny_linear/packed_cpu.h"
#include "ops/claim_parallel.h"

namespace specdec::ops {

// `rounded`: x rounded to bfloat16 for bfloat16 panels on the AMX tier (a prompt's prefill, or every
// row of a model set to bfloat16 activations; packed_cpu.h's prepare_rows_bf16).
inline void packed_linear(const float* x, int64_t M, int64_t K, const at::Tensor& packed, const float* bias,
                          float* y, int64_t N, bool rounded = false) {
  // Panels are claimed in chunks of 256 KiB .. 2 MiB of weights (streaming_grain; Qwen2.5-1.5B:
  // o 8 chunks of 3 panels, gate|up 28 of 10, the LM head 2 MiB each). Each output is computed
  // whole by whichever thread claims its panel: the bits do not depend on the thread count.
  const int64_t grain = streaming_grain(packed.size(0), K * skinny::kPanel * packed.element_size());
  const bool bf16 = packed.scalar_type() == at::kBFloat16;
  const void* panels = packed.data_ptr();
  if (bf16) {
    // x prepared once for every chunk (the AMX tier's split; the caller's buffer, read by all threads)
    thread_local std::vector<uint16_t> scratch;
    const skinny::PreparedRowsBf16 rows = skinny::prepare_rows_bf16(x, M, K, scratch, rounded);
    claim_parallel_range(0, packed.size(0), grain, [&](int64_t begin, int64_t end) {
      skinny::packed_linear_cpu_panels_bf16(rows, static_cast<const uint16_t*>(panels), bias, y, N, begin, end);
    });
    return;
  }
  claim_parallel_range(0, packed.size(0), grain, [&](int64_t begin, int64_t end) {
    skinny::packed_linear_cpu_panels(x, M, K, static_cast<const float*>(panels), bias, y, N, begin, end);
  });
}

}  // namespace specdec::ops
