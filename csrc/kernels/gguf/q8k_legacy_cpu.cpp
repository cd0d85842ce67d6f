// The legacy formats' Q8K matmul (q8k.h, "The legacy formats"): the portable tier, written straight
// from the float order (the reference the VNNI tier, legacy_lanes_avx512_vnni.cpp, is tested
// against bit for bit), and the run-time choice. Compiled for baseline x86-64: the fused steps are
// std::fma, nothing else fuses.
#include <cstdint>

#include "kernels/common/cpu_isa.h"
#include "kernels/gguf/blocks.h"
#include "kernels/gguf/legacy_group.h"
#include "kernels/gguf/panels.h"
#include "kernels/gguf/q8.h"
#include "kernels/gguf/q8_tiers.h"
#include "kernels/gguf/q8k.h"

namespace specdec::gguf {

namespace {

const bool kVnni = cpu_avx512_bw_vl_dq_fma_enabled() && cpu_avx512_vnni_enabled();

void portable_rows(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  const int64_t G = a.K / 32;
  for (int64_t n = n_begin; n < n_end; ++n)
    for (int64_t m = 0; m < M; ++m) {
      const int8_t* q = a.codes(m);
      const float* dx = a.scales(m);
      const int16_t* s = a.sums(m);
      float A = 0.0f;
      for (int64_t g = 0; g < G; ++g)
        legacy_group_steps(type, a.weight + n * a.row_bytes, g, q + 32 * g,
                           static_cast<int32_t>(s[2 * g]) + s[2 * g + 1], dx[g], A);
      a.y[m * a.ldy + n] = A;
    }
}

}  // namespace

bool q8k_legacy_supported(int32_t type) { return is_legacy(file_type(type)); }

void matmul_q8k_legacy_rows(int32_t type, const uint8_t* xq, int64_t M, int64_t K, const uint8_t* weight, float* y,
                            int64_t ldy, int64_t n_begin, int64_t n_end) {
  if (M <= 0 || n_end <= n_begin) return;
  const Q8Args args{xq, q8_row_bytes(K), K, weight, K / kQK * block_bytes(type), y, ldy};
  if (kVnni) {
    legacy_lanes_rows(type, args, M, n_begin, n_end, /*q8_order=*/false);
  } else if (is_panels(type)) {
    panel_groups_in_file_order(type, weight, args.row_bytes, n_begin, n_end,
                               [&](int32_t file, const uint8_t* rows, int64_t g0, int64_t lo, int64_t hi) {
                                 Q8Args group = args;
                                 group.weight = rows;
                                 group.y = y + g0;
                                 portable_rows(file, group, M, lo, hi);
                               });
  } else {
    portable_rows(type, args, M, n_begin, n_end);
  }
}

}  // namespace specdec::gguf
