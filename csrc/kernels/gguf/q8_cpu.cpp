// The Q8-activation GGUF matmul (q8.h): the activation quantiser, the portable matmul tier and the
// run-time choice among the portable, AVX2 (q8_avx2.cpp), AVX-512 (q8_avx512.cpp) and AVX-512 +
// VNNI (q8_avx512_vnni.cpp) tiers.
// Compiled for baseline x86-64: the portable tier's fused steps are std::fma, nothing else fuses.
#include "kernels/gguf/q8.h"

#include <cmath>
#include <cstring>

#include "kernels/common/cpu_isa.h"
#include "kernels/gguf/blocks.h"
#include "kernels/gguf/legacy_group.h"
#include "kernels/gguf/panels.h"
#include "kernels/gguf/q8_round.h"
#include "kernels/gguf/q8_tiers.h"

namespace specdec::gguf {
namespace {

// F16C (the fp16 scales' widening; every AVX2 CPU has it) present.
bool cpu_f16c() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// The tier SPECDEC_CPU_ISA and the CPU allow (kernels/common/cpu_isa.h): AVX-512 needs BW (the
// 512-bit byte and word multiplies) besides F / DQ / VL, and runs vpdpbusd where VNNI is there;
// both vector tiers need F16C.
const bool kAvx512 = cpu_avx512_bw_vl_dq_fma_enabled() && cpu_f16c();
const bool kVnni = kAvx512 && cpu_avx512_vnni_enabled();
const bool kAvx2 = !kAvx512 && cpu_avx2_fma_enabled() && cpu_f16c();

// The portable tier, written straight from q8.h's order (one output at a time): the reference
// the vector tiers are tested against bit for bit.
void portable_output(int32_t type, const Q8Args& a, int64_t m, int64_t n) {
  const int64_t G = a.K / 32, T = a.octets();
  const int8_t* q = a.codes(m);
  const float* dx = a.scales(m);
  const int16_t* s = a.sums(m);
  const uint8_t* row = a.weight + n * a.row_bytes;
  float A[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t t = 0; t < T; ++t) {
    for (int j = 0; j < 8; ++j) {
      const int64_t g = 8 * t + j;
      if (g >= G) continue;
      const int8_t* qg = q + 32 * g;
      const int32_t qsum = static_cast<int32_t>(s[2 * g]) + s[2 * g + 1];
      switch (type) {
        case 8:
        case 6:
        case 3:
          legacy_group_steps(type, row, g, qg, qsum, dx[g], A[j]);
          break;
        case 12:
        case kQ4_K_Lanes: {
          const auto& b = reinterpret_cast<const BlockQ4_K*>(row)[t];
          int sc, mn;
          q4k_scale_min(b.scales, j, sc, mn);
          const uint8_t* qs = b.qs + 32 * (j >> 1);
          int32_t dot = 0;
          for (int l = 0; l < 32; ++l)
            dot += (type == 12 ? (qs[l] >> (4 * (j & 1))) & 15 : q4k_lanes_code(b.qs, j, l)) * qg[l];
          A[j] = std::fma(static_cast<float>(sc * dot), half_to_float(b.d) * dx[g], A[j]);
          A[j] = std::fma(-static_cast<float>(mn * qsum), half_to_float(b.dmin) * dx[g], A[j]);
          break;
        }
        default: {  // Q6_K
          const auto& b = reinterpret_cast<const BlockQ6_K*>(row)[t];
          int32_t lo = 0, hi = 0;
          const bool lanes = is_lanes(type);
          auto code = [&](int l) { return lanes ? q6k_lanes_code(b, j, l) : q6k_code(b, j >> 2, j & 3, l); };
          for (int l = 0; l < 16; ++l) lo += code(l) * qg[l];  // the two halves have their own scales
          for (int l = 16; l < 32; ++l) hi += code(l) * qg[l];
          const int32_t dot = b.scales[2 * j] * lo + b.scales[2 * j + 1] * hi;
          A[j] = std::fma(static_cast<float>(dot), half_to_float(b.d) * dx[g], A[j]);
          break;
        }
      }
    }
  }
  a.y[m * a.ldy + n] = ((A[0] + A[4]) + (A[2] + A[6])) + ((A[1] + A[5]) + (A[3] + A[7]));
}

}  // namespace

int64_t q8_row_bytes(int64_t K) {
  const int64_t T = (K / 32 + 7) / 8;
  return (K + 64 * T + 63) / 64 * 64;
}

void quantize_rows_q8(const float* x, int64_t M, int64_t K, uint8_t* xq) {
  const int64_t T = (K / 32 + 7) / 8, rb = q8_row_bytes(K);
  for (int64_t m = 0; m < M; ++m) {
    uint8_t* out = xq + m * rb;
    std::memset(out, 0, rb);
    quantize_row_int8(x + m * K, K, 32, reinterpret_cast<int8_t*>(out), reinterpret_cast<float*>(out + K),
                      reinterpret_cast<int16_t*>(out + K + 32 * T));
  }
}

void matmul_q8_rows_portable(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  for (int64_t n = n_begin; n < n_end; ++n)
    for (int64_t m = 0; m < M; ++m) portable_output(type, a, m, n);
}

void matmul_q8_cpu_rows(int32_t type, const uint8_t* xq, int64_t M, int64_t K, const uint8_t* weight, float* y,
                        int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (M <= 0 || n_end <= n_begin) return;
  const Q8Args args{xq, q8_row_bytes(K), K, weight, K / block_weights(type) * block_bytes(type), y, ldy};
  if (is_panels(type)) {
    if (kVnni && is_legacy(file_type(type))) {  // 16 rows in the lanes, q8.h's order
      legacy_lanes_rows(type, args, M, n_begin, n_end, /*q8_order=*/true);
      return;
    }
    panel_groups_in_file_order(type, weight, args.row_bytes, n_begin, n_end,
                               [&](int32_t file, const uint8_t* rows, int64_t g0, int64_t lo, int64_t hi) {
                                 matmul_q8_cpu_rows(file, xq, M, K, rows, y + g0, ldy, lo, hi);
                               });
  } else if (is_lanes(type) && !kVnni) {
    // Repacked for a VNNI CPU, run under a narrower SPECDEC_CPU_ISA: the portable loop reads it.
    matmul_q8_rows_portable(type, args, M, n_begin, n_end);
  } else if (kVnni) {
    matmul_q8_rows_avx512_vnni(type, args, M, n_begin, n_end);
  } else if (kAvx512) {
    matmul_q8_rows_avx512(type, args, M, n_begin, n_end);
  } else if (kAvx2) {
    matmul_q8_rows_avx2(type, args, M, n_begin, n_end);
  } else {
    matmul_q8_rows_portable(type, args, M, n_begin, n_end);
  }
}

const char* matmul_q8_cpu_isa() { return kVnni ? "avx512-vnni" : kAvx512 ? "avx512" : kAvx2 ? "avx2" : "portable"; }

}  // namespace specdec::gguf
