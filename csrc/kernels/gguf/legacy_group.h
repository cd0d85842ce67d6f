// One legacy block (Q8_0, Q5_0, Q4_1: 32 weights) of a row of W against the same group of 32
// values of a Q8 activation row (q8.h): the integer sum and the float steps that q8.h's order and
// q8k.h's legacy order both apply to one float32 accumulator. Torch-free; for baseline-x86-64
// files (the fused steps are std::fma).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/gguf/blocks.h"

namespace specdec::gguf {

// Whether `type` is a legacy format (one fp16 scale per 32 weights).
inline bool is_legacy(int32_t type) { return type == 3 || type == 6 || type == 8; }

// A = the float steps of block g of `row` (type: is_legacy) against x's group g: codes qg [32],
// qsum = Σ qg, scale dx:
//   Q8_0  A = fma(float(Σ w q), d_w dx, A)
//   Q5_0  A = fma(float(Σ (w - 16) q), d_w dx, A)
//   Q4_1  A = fma(float(Σ w q), d_w dx, A); A = fma(float(qsum), m_w dx, A)
inline void legacy_group_steps(int32_t type, const uint8_t* row, int64_t g, const int8_t* qg, int32_t qsum, float dx,
                               float& A) {
  switch (type) {
    case 8: {
      const auto& b = reinterpret_cast<const BlockQ8_0*>(row)[g];
      int32_t dot = 0;
      for (int i = 0; i < 32; ++i) dot += static_cast<int32_t>(b.qs[i]) * qg[i];
      A = std::fma(static_cast<float>(dot), half_to_float(b.d) * dx, A);
      return;
    }
    case 6: {
      const auto& b = reinterpret_cast<const BlockQ5_0*>(row)[g];
      uint32_t qh;
      std::memcpy(&qh, b.qh, 4);
      int32_t dot = 0;
      for (int i = 0; i < 32; ++i) {
        const int nib = i < 16 ? (b.qs[i] & 15) : (b.qs[i - 16] >> 4);
        dot += (nib | static_cast<int>((qh >> i) & 1) << 4) * qg[i];
      }
      dot -= 16 * qsum;  // Σ (w - 16) q
      A = std::fma(static_cast<float>(dot), half_to_float(b.d) * dx, A);
      return;
    }
    default: {  // Q4_1
      const auto& b = reinterpret_cast<const BlockQ4_1*>(row)[g];
      int32_t dot = 0;
      for (int i = 0; i < 32; ++i) dot += (i < 16 ? (b.qs[i] & 15) : (b.qs[i - 16] >> 4)) * qg[i];
      A = std::fma(static_cast<float>(dot), half_to_float(b.d) * dx, A);
      A = std::fma(static_cast<float>(qsum), half_to_float(b.m) * dx, A);
      return;
    }
  }
}

}  // namespace specdec::gguf
