// Shape rules shared by the CPU and CUDA glue of the `quant` family.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>

namespace specdec::ops {

inline constexpr int64_t kLayoutCpu = 0;   // reference/quant.py LAYOUT_CPU
inline constexpr int64_t kLayoutCuda = 1;  // reference/quant.py LAYOUT_CUDA

// Returns the group size in input features (-1 = per channel = K). Both kernels read 32 input
// features of one row at a time (the CUDA kernel one 16-byte load), all under one scale, so K and
// the group must be multiples of 32; other shapes are rejected here, naming them.
inline int64_t check_w4_shape(int64_t N, int64_t K, int64_t group_size) {
  TORCH_CHECK(N >= 0 && K > 0 && K % 32 == 0,
              "4-bit weights need in_features K to be a positive multiple of 32; got weight shape [",
              N, ", ", K, "] (pad K with zero columns)");
  const int64_t group = group_size == -1 ? K : group_size;
  TORCH_CHECK(group > 0 && group % 32 == 0 && K % group == 0, "group_size must be -1 (per channel) or a ",
              "multiple of 32 that divides K; got group_size=", group_size, " for weight shape [", N, ", ", K, "]");
  return group;
}

}  // namespace specdec::ops
