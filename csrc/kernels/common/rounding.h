// Correctly rounded single float32 operations (mul_rn, add_rn, sub_rn, div_rn) that no compiler
// may contract into a fused multiply-add: the kernels that must reproduce a reference bit for bit
// (the int4 KV cache's quantiser, the GGUF dequantisers) spell every rounding step with these.
// On CUDA the _rn intrinsics forbid the contraction; on the host the callers are compiled for
// baseline x86-64, which has no FMA to contract to.
#pragma once

#include "kernels/common/hd.h"

namespace specdec {

SPECDEC_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SPECDEC_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SPECDEC_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
SPECDEC_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
}  // namespace specdec
