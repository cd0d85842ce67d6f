// The panel layouts of Q4_K and Q6_K weights: Q4_K_PANELS (type 524) and Q6_K_PANELS (526), not
// ggml types but this project's repacking at load for the Q8K kernel (q8k.h) on CPUs with AVX-512
// VNNI and no AMX, where a model decodes and verifies on it (ops/gguf_linear.h, mode Q8K + Q8).
// Torch-free, scalar: the conversions run once at load, or where a kernel without a panel loop
// meets a repacked weight (not a decoding path).
//
// Why: the Q8K kernel multiplies 16 rows of W in the vector lanes, each step a zmm of [16 rows][4
// codes]. Gathered from rows stored one after another (the file's order, or the lane order), the
// panel costs a pass over the blocks per call, ~26 ns per super-block and row of W on a Zen 4 core:
// at one or five rows of x more than the products. Stored as panels, a step is one load and a
// nibble split, and the kernel runs at every row count.
//
// The layout: a weight [N, K] (N a multiple of 16) keeps its bytes, N * K / 256 * block bytes, in
// groups of 16 rows; group G holds rows 16 G .. 16 G + 15 in bytes [16 G rb, 16 (G + 1) rb) (rb the
// file's row bytes), one panel per super-block t at 16 t * (block bytes) within it. c(r, k) is code k
// (0..255, the weight's order) of row r's super-block t: Q4_K 0..15, Q6_K 0..63 (value c - 32).
//   Q4_K panel, 2304 bytes:
//     [0, 2048)     32 pairs p of 64 bytes: byte 4 r + b = c(r, 8p + b) | c(r, 8p + 4 + b) << 4
//     [2048, 2240)  3 chunks j of 64 bytes: bytes 4 r .. 4 r + 3 = row r's scales[4 j .. 4 j + 3]
//     [2240, 2304)  bytes 4 r .. 4 r + 3 = row r's d, dmin (fp16)
//   Q6_K panel, 3360 bytes:
//     [0, 2048)     as Q4_K's codes, of the low 4 bits c & 15
//     [2048, 3072)  16 quads u of 64 bytes: byte 4 r + b, bits 2i .. 2i + 1 = c(r, 16u + 4i + b) >> 4
//     [3072, 3328)  4 chunks j of 64 bytes: bytes 4 r .. 4 r + 3 = row r's scales[4 j .. 4 j + 3]
//     [3328, 3360)  bytes 2 r, 2 r + 1 = row r's d (fp16)
// So step s (codes 4s .. 4s + 3 of every row) is nibble s & 1 of pair s / 2 (and Q6_K's bits
// 2 (s & 3) of quad s / 4), and a row's scales are dwords of 16-lane vectors. The values, and the
// bits of every kernel that reads the layout, are the file format's.
#pragma once

#include <cstdint>
#include <cstring>

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

// 16 rows of a file-order Q4_K / Q6_K weight (`file`; rb bytes each, from `rows`) <-> their
// group of panels (16 rb bytes at `panels`), both ways: to_panels true writes panels.
inline void convert_panel_group(int32_t file, uint8_t* rows, int64_t rb, uint8_t* panels, bool to_panels) {
  const int64_t bb = block_bytes(file), T = rb / bb, pb = kPanelRows * bb;
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

// The group of panels at `panels` (type: Q4_K_PANELS / Q6_K_PANELS, rb the file's row bytes) ->
// its 16 rows in the file's order at `rows`.
inline void blocks_from_panels(int32_t type, const uint8_t* panels, int64_t rb, uint8_t* rows) {
  convert_panel_group(file_type(type), rows, rb, const_cast<uint8_t*>(panels), false);
}

}  // namespace specdec::gguf
