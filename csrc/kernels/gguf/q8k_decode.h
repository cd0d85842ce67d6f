// Internal to the Q8K matmul (q8k.h): one k-quant super-block of one row of W as the integers and
// scales the float order names, whatever the block's layout (file order or lane order), and the
// 16-row panel the AVX-512 VNNI tier multiplies. Torch-free.
#pragma once

#include <cstdint>

#include "kernels/gguf/blocks.h"

namespace specdec::gguf {

// One super-block of one row: codes w_k (Q4_K 0..15, Q6_K 0..63) in k order; the coefficients of
// the float order per sub-block (sc: Q4_K's 8 six-bit scales, Q6_K's 16 int8 ones) and per 16
// values of x's sums (pc: Q4_K's min of the sub-block holding them, Q6_K's scale); d, dmin.
struct Q8kSuperblock {
  uint8_t w[256];
  int32_t sc[16];
  int32_t pc[16];
  float d, dmin;
};

// Sub-blocks per super-block: Q4_K 8 of 32 values, Q6_K 16 of 16.
inline int q8k_sub_blocks(int32_t type) { return file_type(type) == 12 ? 8 : 16; }

// Super-block t's scales, mins and d of the row at `row` (out.sc, out.pc, out.d, out.dmin; the
// codes untouched): what the VNNI tier's panels read per row, their codes gathered apart.
inline void q8k_decode_scales(int32_t type, const uint8_t* row, int64_t t, Q8kSuperblock& out) {
  if (file_type(type) == 12) {
    const auto& b = reinterpret_cast<const BlockQ4_K*>(row)[t];
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      q4k_scale_min(b.scales, s, sc, m);
      out.sc[s] = sc;
      out.pc[2 * s] = out.pc[2 * s + 1] = m;
    }
    out.d = half_to_float(b.d);
    out.dmin = half_to_float(b.dmin);
    return;
  }
  const auto& b = reinterpret_cast<const BlockQ6_K*>(row)[t];
  for (int s = 0; s < 16; ++s) out.sc[s] = out.pc[s] = b.scales[s];
  out.d = half_to_float(b.d);
  out.dmin = 0.0f;
}

// Super-block t of the row at `row` (type: Q4_K, Q6_K or their lane-order layouts).
inline void q8k_decode(int32_t type, const uint8_t* row, int64_t t, Q8kSuperblock& out) {
  q8k_decode_scales(type, row, t, out);
  if (file_type(type) == 12) {
    const auto& b = reinterpret_cast<const BlockQ4_K*>(row)[t];
    const bool lanes = type == kQ4_K_Lanes;
    for (int s = 0; s < 8; ++s)
      for (int l = 0; l < 32; ++l)
        out.w[32 * s + l] = static_cast<uint8_t>(lanes ? q4k_lanes_code(b.qs, s, l)
                                                       : (b.qs[32 * (s >> 1) + l] >> (4 * (s & 1))) & 15);
    return;
  }
  const auto& b = reinterpret_cast<const BlockQ6_K*>(row)[t];
  const bool lanes = type == kQ6_K_Lanes;
  for (int g = 0; g < 8; ++g)  // 32-weight group g = weights 32g .. 32g + 31
    for (int l = 0; l < 32; ++l)
      out.w[32 * g + l] = static_cast<uint8_t>((lanes ? q6k_lanes_code(b, g, l) : q6k_code(b, g >> 2, g & 3, l)) + 32);
}

// The scales of 16 rows of W for one super-block (rows past the weight's end all zero), as the
// VNNI tier reads them:
//   sc  [16 sub-blocks][16 rows] int32
//   pc  [8 pairs][16 rows]       int32 lanes holding the int16 pair (pc_2i, pc_2i+1)
//   d, dmin [16 rows]
struct alignas(64) Q8kScales {
  int32_t sc[16 * 16];
  int32_t pc[8 * 16];
  float d[16], dmin[16];
};

// The panel of 16 rows of W for one super-block, gathered per call from rows stored one after
// another (the file's or the lane order): w [64 steps][16 rows][4] = codes 4 step .. 4 step + 3 of
// each row (a zmm per step), and the scales.
struct alignas(64) Q8kPanel {
  uint8_t w[64 * 64];
  Q8kScales s;
};

// Row r of the panel's scales, pairs, d and dmin from one decoded super-block (or zeros: `sb` null).
inline void q8k_panel_scales(const Q8kSuperblock* sb, int r, Q8kPanel& panel) {
  Q8kScales& p = panel.s;
  for (int s = 0; s < 16; ++s) p.sc[s * 16 + r] = sb ? sb->sc[s] : 0;
  for (int i = 0; i < 8; ++i) {
    const uint32_t lo = sb ? static_cast<uint16_t>(static_cast<int16_t>(sb->pc[2 * i])) : 0;
    const uint32_t hi = sb ? static_cast<uint16_t>(static_cast<int16_t>(sb->pc[2 * i + 1])) : 0;
    p.pc[i * 16 + r] = static_cast<int32_t>(lo | hi << 16);
  }
  p.d[r] = sb ? sb->d : 0.0f;
  p.dmin[r] = sb ? sb->dmin : 0.0f;
}

// Row r of the panel from one decoded super-block (or zeros: `sb` null).
inline void q8k_panel_row(const Q8kSuperblock* sb, int r, Q8kPanel& p) {
  for (int step = 0; step < 64; ++step)
    for (int b = 0; b < 4; ++b) p.w[(step * 16 + r) * 4 + b] = sb ? sb->w[4 * step + b] : 0;
  q8k_panel_scales(sb, r, p);
}

}  // namespace specdec::gguf
