// Run-time choice of the AVX-512 kernels on x86-64 (a default build targets baseline x86-64).
// SPECDEC_CPU_ISA set to anything but "avx512" (e.g. "baseline") caps the choice below it, so the
// tests can run the portable loops on an AVX-512 machine. Kernels with other ISA tiers (w4_cpu,
// quant_attention) keep their own detection.
#pragma once

#include <cstdlib>
#include <cstring>

namespace specdec {

// AVX-512F + DQ with FMA present and not capped by SPECDEC_CPU_ISA.
inline bool cpu_avx512_fma_enabled() {
#if defined(__x86_64__)
  const char* cap = std::getenv("SPECDEC_CPU_ISA");
  if (cap != nullptr && std::strcmp(cap, "avx512") != 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

}  // namespace specdec
