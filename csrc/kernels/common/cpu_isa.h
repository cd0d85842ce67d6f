// Every run-time ISA choice of the CPU kernels on x86-64 (a default build targets baseline x86-64,
// so the wider kernels come in through target attributes and are picked here). SPECDEC_CPU_ISA
// caps the choice: unset or "avx512" allows every tier, "avx512-novnni" every one but the AVX-512
// VNNI and AMX kernels, "avx2" allows AVX2 and not AVX-512, anything else (e.g. "baseline") allows
// neither, so the tests can run each narrower tier on a wider machine. Each *_enabled() below is
// "the cap allows the tier and the CPU has the features its kernels use"; callers read them once,
// at load.
#pragma once

#include <cstdlib>
#include <cstring>

namespace specdec {

// SPECDEC_CPU_ISA allows the AVX-512 VNNI kernels: unset or "avx512".
inline bool cpu_isa_allows_vnni() {
  const char* cap = std::getenv("SPECDEC_CPU_ISA");
  return cap == nullptr || std::strcmp(cap, "avx512") == 0;
}

// SPECDEC_CPU_ISA allows the AMX kernels: unset or "avx512", as the VNNI ones (a cap of
// "avx512-novnni" runs the FMA tiers of the bfloat16 panels on an AMX machine).
inline bool cpu_isa_allows_amx() { return cpu_isa_allows_vnni(); }

// SPECDEC_CPU_ISA allows the AVX-512 tiers: unset, "avx512" or "avx512-novnni" (AVX-512 without
// the VNNI kernels, so that their AVX-512 siblings run on a VNNI machine too).
inline bool cpu_isa_allows_avx512() {
  const char* cap = std::getenv("SPECDEC_CPU_ISA");
  return cpu_isa_allows_vnni() || std::strcmp(cap, "avx512-novnni") == 0;
}

// SPECDEC_CPU_ISA allows the AVX2 tiers: unset, "avx512", "avx512-novnni" or "avx2".
inline bool cpu_isa_allows_avx2() {
  const char* cap = std::getenv("SPECDEC_CPU_ISA");
  return cpu_isa_allows_avx512() || std::strcmp(cap, "avx2") == 0;
}

// AVX-512F + DQ with FMA present and not capped (skinny, packed, decoder-layer and GGUF kernels).
inline bool cpu_avx512_fma_enabled() {
#if defined(__x86_64__)
  if (!cpu_isa_allows_avx512()) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// AVX-512F present and not capped (the W4A16 kernels use F only).
inline bool cpu_avx512f_enabled() {
#if defined(__x86_64__)
  if (!cpu_isa_allows_avx512()) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

// AVX-512 F / BW / VL / DQ with FMA present and not capped (the quantised-KV attention kernel).
inline bool cpu_avx512_bw_vl_dq_fma_enabled() {
#if defined(__x86_64__)
  if (!cpu_isa_allows_avx512()) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// AVX-512 VNNI (vpdpbusd) present and not capped; callers also check their AVX-512 tier's features.
inline bool cpu_avx512_vnni_enabled() {
#if defined(__x86_64__)
  if (!cpu_isa_allows_vnni()) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

// AVX2 with FMA present and not capped.
inline bool cpu_avx2_fma_enabled() {
#if defined(__x86_64__)
  if (!cpu_isa_allows_avx2()) return false;
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

// The AVX2 tier runs: AVX2 + FMA allowed and present, and the AVX-512 tier not taking its place.
inline bool cpu_avx2_is_widest() { return !cpu_avx512_fma_enabled() && cpu_avx2_fma_enabled(); }

}  // namespace specdec
