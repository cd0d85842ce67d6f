// Checks shared by the CPU and CUDA glue of the `gguf` family: a GGUF weight [N, K] is a uint8
// tensor of its blocks as stored in the file (kernels/gguf/blocks.h), N rows of K / QK blocks.
#pragma once

#include "ops/aten.h"
#include <c10/util/Exception.h>

#include <cstdint>

#include "kernels/gguf/blocks.h"
#include "kernels/gguf/panels.h"

namespace specdec::ops {

inline const char* gguf_type_name(int64_t type) {
  switch (type) {
    case 3: return "Q4_1";
    case 6: return "Q5_0";
    case 8: return "Q8_0";
    case 12: return "Q4_K";
    case 14: return "Q6_K";
    case gguf::kQ4_K_Lanes: return "Q4_K_LANES";
    case gguf::kQ6_K_Lanes: return "Q6_K_LANES";
    case gguf::kQ4_1_Panels: return "Q4_1_PANELS";
    case gguf::kQ5_0_Panels: return "Q5_0_PANELS";
    case gguf::kQ8_0_Panels: return "Q8_0_PANELS";
    case gguf::kQ4_K_Panels: return "Q4_K_PANELS";
    case gguf::kQ6_K_Panels: return "Q6_K_PANELS";
    default: return "unsupported";
  }
}

// weight: (N, K / QK * block_bytes) or (N * K / QK * block_bytes,) uint8, contiguous, 2-byte aligned
// (the blocks' fp16 scales). `op` names the caller in the messages. The panel layouts
// (kernels/gguf/panels.h: N a multiple of 16) only where the op reads them (`panels`).
inline void check_gguf_weight(const char* op, const at::Tensor& weight, int64_t type, int64_t N, int64_t K,
                              bool panels = false) {
  const int qk = gguf::block_weights(static_cast<int32_t>(type));
  TORCH_CHECK(qk > 0, op, ": type must be a GGML type id of Q4_1 (3), Q5_0 (6), Q8_0 (8), Q4_K (12) or Q6_K (14), or ",
              gguf::kQ4_K_Lanes, " / ", gguf::kQ6_K_Lanes, " (Q4_K_LANES / Q6_K_LANES: gguf_repack_lanes's), or ",
              "512 + one of those (a panel layout: gguf_repack_panels's); got ", type);
  const bool is_panels = gguf::is_panels(static_cast<int32_t>(type));
  TORCH_CHECK(!is_panels || panels, op, ": ", gguf_type_name(type), " (a panel layout) is read by gguf_linear, ",
              "decoder_layer_gguf and gguf_dequantize on the CPU only; turn it back with ",
              "gguf_repack_panels(inverse=True)");
  TORCH_CHECK(!is_panels || N % gguf::kPanelRows == 0, op, ": a ", gguf_type_name(type),
              " weight holds whole groups of ", gguf::kPanelRows, " rows; got N = ", N);
  const int64_t bytes = gguf::block_bytes(static_cast<int32_t>(type));
  TORCH_CHECK(N >= 0 && K > 0 && K % qk == 0, op, ": in_features K must be a positive multiple of ", gguf_type_name(type),
              "'s ", qk, "-weight block; got weight shape [", N, ", ", K, "]");
  const int64_t row_bytes = K / qk * bytes;
  TORCH_CHECK(weight.scalar_type() == at::kByte, op, ": weight must be the uint8 bytes of the ", gguf_type_name(type),
              " blocks; got ", weight.scalar_type(), " ", weight.sizes());
  TORCH_CHECK(weight.numel() == N * row_bytes && (weight.dim() == 1 || (weight.dim() == 2 && weight.size(0) == N)),
              op, ": a ", gguf_type_name(type), " weight [", N, ", ", K, "] is N * K / ", qk, " blocks * ", bytes,
              " bytes = [", N, ", ", row_bytes, "] uint8 (or that many bytes flat); got weight ", weight.sizes());
  TORCH_CHECK(weight.is_contiguous(), op, ": weight must be contiguous; got strides ", weight.strides());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(weight.data_ptr()) % 2 == 0, op,
              ": weight must start on an even address (its blocks hold fp16 scales); clone it");
}

}  // namespace specdec::ops
