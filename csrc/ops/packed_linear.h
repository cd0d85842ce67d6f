// y [M, N] = x [M, K] · Wᵀ (+ bias) from a packed weight tensor (float32 or bfloat16 panels, see
// kernels/skinny_linear/packed_cpu.h), the panels split over torch's threads: what the
// skinny_linear_packed op and the decoder_layer op both run. The caller has checked the shapes.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "kernels/skinny_linear/packed_cpu.h"
#include "ops/quant_parallel.h"

namespace specdec::ops {

inline void packed_linear(const float* x, int64_t M, int64_t K, const at::Tensor& packed, const float* bias,
                          float* y, int64_t N) {
  // 4 panels are 4 * K * 256 bytes of float32 weight (1 MiB at K = 1024): worth a thread start.
  parallel_range(0, packed.size(0), 4, [&](int64_t begin, int64_t end) {
    if (packed.scalar_type() == at::kBFloat16)
      skinny::packed_linear_cpu_panels_bf16(x, M, K, reinterpret_cast<const uint16_t*>(packed.data_ptr<at::BFloat16>()),
                                            bias, y, N, begin, end);
    else
      skinny::packed_linear_cpu_panels(x, M, K, packed.data_ptr<float>(), bias, y, N, begin, end);
  });
}

}  // namespace specdec::ops
