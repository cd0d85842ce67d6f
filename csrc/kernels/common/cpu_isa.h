// Run-time choice of the AVX-512 and AVX2 kernels on x86-64 (a default build targets baseline
// x86-64). SPECDEC_CPU_ISA caps the choice: "avx2" allows AVX2 and not AVX-512, anything else but
// "avx512" (e.g. "baseline") allows neither, so the tests can run each narrower tier on a wider
// machine. Kernels with their own tiers (w4_cpu, quant_attention) keep their own detection.
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

// AVX2 with FMA present and SPECDEC_CPU_ISA unset, "avx512" or "avx2".
inline bool cpu_avx2_fma_enabled() {
#if defined(__x86_64__)
  const char* cap = std::getenv("SPECDEC_CPU_ISA");
  if (cap != nullptr && std::strcmp(cap, "avx512") != 0 && std::strcmp(cap, "avx2") != 0) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// The AVX2 tier runs: AVX2 + FMA allowed and present, and the AVX-512 tier not taking its place.
inline bool cpu_avx2_is_widest() { return !cpu_avx512_fma_enabled() && cpu_avx2_fma_enabled(); }

}  // namespace specdec
