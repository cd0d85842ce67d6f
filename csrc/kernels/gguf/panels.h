// The panel layouts of GGUF weights: Q4_K_PANELS (type 524), Q6_K_PANELS (526), Q8_0_PANELS (520),
// Q5_0_PANELS (518) and Q4_1_PANELS (515): not ggml types (512 + the file format's id) but this
// project's repacking at load for the kernels that hold 16 rows of W in the vector lanes, on CPUs
// with AVX-512 VNNI and no AMX: the Q8K kernel for the k-quants (q8k.h, ops/gguf_linear.h's mode
// Q8K + Q8), the lanes kernel in q8.h's order for the legacy formats (legacy_lanes_avx512_vnni.cpp).
// Torch-free, scalar: the conversions run once at load, or where a kernel without a panel loop
// meets a repacked weight (not a decoding path).
//
// Why: those kernels multiply 16 rows of W in the vector lanes, each step a zmm of [16 rows][4
// codes]. Gathered from rows stored one after another (the file's order, or the lane order), the
// panel costs a pass over the blocks per call, ~26 ns per super-block and row of W on a Zen 4 core:
// at one or five rows of x more than the products. Stored as panels, a step is one load and a
// nibble split, and the kernels run at every row count.
//
// The layout: a weight [N, K] (N a multiple of 16) keeps its bytes, N * K / QK * block bytes, in
// groups of 16 rows; group G holds rows 16 G .. 16 G + 15 in bytes [16 G rb, 16 (G + 1) rb) (rb the
// file's row bytes), one panel per block column t (a super-block, or a legacy block of 32) at
// 16 t * (block bytes) within it. c(r, k) is code k (the weight's order) of row r's block t:
// Q4_K 0..15, Q6_K 0..63 (value c - 32), Q8_0 w + 128, Q5_0 0..31 (value c - 16), Q4_1 0..15.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gguf/blocks.h"

namespace specdec::gguf {

inline constexpr int kPanelRows = 16;

// Code k (0..255) of a file-order super-block of `file` (Q4_K: 0..15, Q6_K: 0..63).
inline int kquant_code(int32_t file, const uint8_t* block, int k) {
  if (file == 12) {
    const auto& b = *reinterpret_cast<const BlockQ4_K*>(block);
    const int s = k >> 5;
    return (b.qs[32 * (s >> 1) + (k & 31)] >> (4 * (s & 1))) & 15;
  }
  return q6k_code(*reinterpret_cast<const BlockQ6_K*>(block), k >> 7, (k >> 5) & 3, k & 31) + 32;
}

// Sets code k of a file-order super-block whose code bytes were zeroed (the inverse of kquant_code).
inline void set_kquant_code(int32_t file, uint8_t* block, int k, int code) {
  if (file == 12) {
    auto& b = *reinterpret_cast<BlockQ4_K*>(block);
    const int s = k >> 5;
    b.qs[32 * (s >> 1) + (k & 31)] |= static_cast<uint8_t>(code << (4 * (s & 1)));
    return;
  }
  auto& b = *reinterpret_cast<BlockQ6_K*>(block);
  const int h = k >> 7, i = (k >> 5) & 3, l = k & 31;
  b.ql[64 * h + l + 32 * (i & 1)] |= static_cast<uint8_t>((code & 15) << (4 * (i >> 1)));
  b.qh[32 * h + l] |= static_cast<uint8_t>((code >> 4) << (2 * i));
}

// Code k (0..31) of a legacy block (`file`: Q8_0 w + 128, Q5_0 0..31, Q4_1 0..15).
inline int legacy_code(int32_t file, const uint8_t* block, int k) {
  if (file == 8) return static_cast<uint8_t>(reinterpret_cast<const BlockQ8_0*>(block)->qs[k]) ^ 0x80;
  const uint8_t* qs = block + (file == 6 ? 6 : 4);
  const int low = (k < 16 ? qs[k] : qs[k - 16] >> 4) & 15;
  if (file == 3) return low;
  uint32_t qh;
  std::memcpy(&qh, block + 2, 4);
  return low | static_cast<int>((qh >> k) & 1) << 4;
}

// Sets code k of a legacy block whose code bytes were zeroed (the inverse of legacy_code).
inline void set_legacy_code(int32_t file, uint8_t* block, int k, int code) {
  if (file == 8) {
    block[2 + k] = static_cast<uint8_t>(code ^ 0x80);
    return;
  }
  uint8_t* qs = block + (file == 6 ? 6 : 4);
  qs[k & 15] |= static_cast<uint8_t>((code & 15) << (k < 16 ? 0 : 4));
  if (file == 6) block[2 + k / 8] |= static_cast<uint8_t>(((code >> 4) & 1) << (k % 8));
}

// The legacy panels of block column t (see the layout above) <-> 16 rows' blocks, both ways.
inline void convert_legacy_column(int32_t file, uint8_t* rows, int64_t rb, int64_t t, uint8_t* p, bool to_panels) {
  const int64_t bb = block_bytes(file);
  if (to_panels) std::memset(p, 0, static_cast<size_t>(kPanelRows * bb));
  for (int r = 0; r < kPanelRows; ++r) {
    uint8_t* block = rows + r * rb + t * bb;
    const int64_t head = file == 3 ? 4 : 2;  // d (Q4_1: d, m) at the block's start
    const int64_t at = file == 8 ? 512 + 2 * r : file == 6 ? 320 + 2 * r : 256 + 4 * r;
    if (to_panels) {
      std::memcpy(p + at, block, head);
    } else {
      std::memset(block, 0, static_cast<size_t>(bb));
      std::memcpy(block, p + at, head);
    }
    for (int k = 0; k < 32; ++k) {
      const int64_t step = k >> 2, b = k & 3;
      if (file == 8) {
        if (to_panels) p[64 * step + 4 * r + b] = static_cast<uint8_t>(legacy_code(file, block, k));
        else set_legacy_code(file, block, k, p[64 * step + 4 * r + b]);
        continue;
      }
      const int64_t low = 64 * (k >> 3) + 4 * r + b, shift = 4 * (step & 1), high = 256 + 4 * r + b;
      if (to_panels) {
        const int c = legacy_code(file, block, k);
        p[low] |= static_cast<uint8_t>((c & 15) << shift);
        if (file == 6) p[high] |= static_cast<uint8_t>((c >> 4) << step);
      } else {
        const int c = ((p[low] >> shift) & 15) | (file == 6 ? ((p[high] >> step) & 1) << 4 : 0);
        set_legacy_code(file, block, k, c);
      }
    }
  }
}

// 16 rows of a file-order weight (`file`; rb bytes each, from `rows`) <-> their group of panels
// (16 rb bytes at `panels`), both ways: to_panels true writes panels.
inline void convert_panel_group(int32_t file, uint8_t* rows, int64_t rb, uint8_t* panels, bool to_panels) {
  const int64_t bb = block_bytes(file), T = rb / bb, pb = kPanelRows * bb;
  if (file != 12 && file != 14) {
    for (int64_t t = 0; t < T; ++t) convert_legacy_column(file, rows, rb, t, panels + t * pb, to_panels);
    return;
  }
  const bool q4 = file == 12;
  for (int64_t t = 0; t < T; ++t) {
    uint8_t* p = panels + t * pb;
    if (to_panels) std::memset(p, 0, static_cast<size_t>(pb));
    for (int r = 0; r < kPanelRows; ++r) {
      uint8_t* block = rows + r * rb + t * bb;
      if (!to_panels) {  // the code bytes are ORed in below; scales and scales' fp16 copied
        if (q4) std::memset(block + 16, 0, 128); else std::memset(block, 0, 192);
      }
      // scales and fp16 fields: (panel offset, block offset, bytes)
      auto field = [&](int64_t at, int64_t from, int n) {
        if (to_panels) std::memcpy(p + at, block + from, n); else std::memcpy(block + from, p + at, n);
      };
      if (q4) {
        for (int j = 0; j < 3; ++j) field(2048 + 64 * j + 4 * r, 4 + 4 * j, 4);
        field(2240 + 4 * r, 0, 4);
      } else {
        for (int j = 0; j < 4; ++j) field(3072 + 64 * j + 4 * r, 192 + 4 * j, 4);
        field(3328 + 2 * r, 208, 2);
      }
      for (int k = 0; k < 256; ++k) {
        const int64_t low = 64 * (k >> 3) + 4 * r + (k & 3), shift = 4 * ((k >> 2) & 1);
        const int64_t high = 2048 + 64 * (k >> 4) + 4 * r + (k & 3), hshift = 2 * ((k >> 2) & 3);
        if (to_panels) {
          const int c = kquant_code(file, block, k);
          p[low] |= static_cast<uint8_t>((c & 15) << shift);
          if (!q4) p[high] |= static_cast<uint8_t>((c >> 4) << hshift);
        } else {
          const int c = ((p[low] >> shift) & 15) | (q4 ? 0 : ((p[high] >> hshift) & 3) << 4);
          set_kquant_code(file, block, k, c);
        }
      }
    }
  }
}

// The group of panels at `panels` (type: a panel layout, rb the file's row bytes) -> its 16 rows
// in the file's order at `rows`.
inline void blocks_from_panels(int32_t type, const uint8_t* panels, int64_t rb, uint8_t* rows) {
  convert_panel_group(file_type(type), rows, rb, const_cast<uint8_t*>(panels), false);
}

// Rows [n_begin, n_end) of a panel weight (type, rb the file's row bytes) for a kernel of the
// file's order: each group of 16 rows holding some of them back in that order in a per-thread
// buffer, then run(file type, the buffer's rows, g0, lo, hi): rows [lo, hi) of the buffer are rows
// g0 + lo .. g0 + hi of the weight.
template <class Run>
void panel_groups_in_file_order(int32_t type, const uint8_t* weight, int64_t rb, int64_t n_begin, int64_t n_end,
                                Run&& run) {
  static thread_local std::vector<uint8_t> rows;
  rows.resize(static_cast<size_t>(kPanelRows * rb));
  for (int64_t g0 = n_begin / kPanelRows * kPanelRows; g0 < n_end; g0 += kPanelRows) {
    blocks_from_panels(type, weight + g0 * rb, rb, rows.data());
    run(file_type(type), rows.data(), g0, std::max(n_begin, g0) - g0, std::min(n_end, g0 + kPanelRows) - g0);
  }
}

}  // namespace specdec::gguf
