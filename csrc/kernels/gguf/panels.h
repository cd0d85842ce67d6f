// The panel layouts of GGUF weights: Q4_K_PANELS (type 524), Q6_K_PANELS (526), Q8_0_PANELS (520),
// Q5_0_PANELS (518) and Q4_1_PANELS (515): not ggml types (512 + the file format's id) but this
// project's repacking at load for the kernels that hold 16 rows of W in the vector lanes, on CPUs
// with AVX-512 VNNI: the Q8K kernel for the k-quants (q8k.h, ops/gguf_linear.h's mode Q8K + Q8),
// the lanes kernel in q8.h's order for the legacy formats (legacy_lanes_avx512_vnni.cpp), and on
// AMX CPUs a prompt's tile kernel (bf16_amx_panels.cpp).
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

// Sets code k (0..255; Q4_K: 0..15, Q6_K: 0..63) of a file-order super-block whose code bytes were
// zeroed.
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

// Sets code k (0..31: Q8_0 w + 128, Q5_0 0..31, Q4_1 0..15) of a legacy block whose code bytes were
// zeroed.
inline void set_legacy_code(int32_t file, uint8_t* block, int k, int code) {
  if (file == 8) {
    block[2 + k] = static_cast<uint8_t>(code ^ 0x80);
    return;
  }
  uint8_t* qs = block + (file == 6 ? 6 : 4);
  qs[k & 15] |= static_cast<uint8_t>((code & 15) << (k < 16 ? 0 : 4));
  if (file == 6) block[2 + k / 8] |= static_cast<uint8_t>(((code >> 4) & 1) << (k % 8));
}

// The legacy panels of block column t (see the layout above) -> 16 rows' blocks.
inline void legacy_column_to_blocks(int32_t file, const uint8_t* p, int64_t t, uint8_t* rows, int64_t rb) {
  const int64_t bb = block_bytes(file);
  for (int r = 0; r < kPanelRows; ++r) {
    uint8_t* block = rows + r * rb + t * bb;
    const int64_t head = file == 3 ? 4 : 2;  // d (Q4_1: d, m) at the block's start
    const int64_t at = file == 8 ? 512 + 2 * r : file == 6 ? 320 + 2 * r : 256 + 4 * r;
    std::memset(block, 0, static_cast<size_t>(bb));
    std::memcpy(block, p + at, head);
    for (int k = 0; k < 32; ++k) {
      const int64_t step = k >> 2, b = k & 3;
      if (file == 8) {
        set_legacy_code(file, block, k, p[64 * step + 4 * r + b]);
        continue;
      }
      const int64_t low = 64 * (k >> 3) + 4 * r + b, shift = 4 * (step & 1), high = 256 + 4 * r + b;
      set_legacy_code(file, block, k, ((p[low] >> shift) & 15) | (file == 6 ? ((p[high] >> step) & 1) << 4 : 0));
    }
  }
}

inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }

// The 4 bytes of a panel's nibble step for one row: codes k .. k + 3 in the low nibbles and k + 4 ..
// k + 7 in the high ones, from the 4-bit code bytes `lo` (codes k ..) and `hi` (codes k + 4 ..) of
// the file's block, each code at bit `shift` of its byte.
inline uint32_t nibble_step(const uint8_t* lo, const uint8_t* hi, int shift) {
  return ((load_u32(lo) >> shift) & 0x0F0F0F0Fu) | (((load_u32(hi) >> shift) & 0x0F0F0F0Fu) << 4);
}

// The panels of 16 rows of a file-order weight, 4 bytes at a time (the layout above; once at load:
// made one code at a time, the 1.5B's repack took 3 s). blocks_from_panels below turns them back;
// tests/test_gguf_panels.py holds both to reference.gguf.to_panels / from_panels byte for byte.
inline void panels_of_group(int32_t file, const uint8_t* rows, int64_t rb, uint8_t* panels) {
  const int64_t bb = block_bytes(file), T = rb / bb, pb = kPanelRows * bb;
  for (int64_t t = 0; t < T; ++t) {
    uint8_t* p = panels + t * pb;
    for (int r = 0; r < kPanelRows; ++r) {
      const uint8_t* block = rows + r * rb + t * bb;
      if (file == 12) {  // Q4_K: d, dmin, scales[12], qs[128]; code k: qs[32 (s >> 1) + k % 32] >> 4 (s & 1), s = k/32
        for (int i = 0; i < 32; ++i) {
          const int s = i >> 2;
          const uint8_t* q = block + 16 + 32 * (s >> 1) + 8 * (i & 3);
          store_u32(p + 64 * i + 4 * r, nibble_step(q, q + 4, 4 * (s & 1)));
        }
        for (int j = 0; j < 3; ++j) std::memcpy(p + 2048 + 64 * j + 4 * r, block + 4 + 4 * j, 4);
        std::memcpy(p + 2240 + 4 * r, block, 4);
      } else if (file == 14) {  // Q6_K: ql[128], qh[64], scales[16], d
        for (int i = 0; i < 32; ++i) {  // codes 8 i ..: h = k >> 7, quarter c = (k >> 5) & 3
          const int h = i >> 4, c = (i >> 2) & 3;
          const uint8_t* q = block + 64 * h + 32 * (c & 1) + 8 * (i & 3);
          store_u32(p + 64 * i + 4 * r, nibble_step(q, q + 4, 4 * (c >> 1)));
        }
        for (int i = 0; i < 16; ++i) {  // the 2-bit planes of codes 16 i + 4 e + b at bits 2 e of byte b
          const int h = i >> 3, c = (i >> 1) & 3;
          const uint8_t* qh = block + 128 + 32 * h + 16 * (i & 1);
          uint32_t v = 0;
          for (int e = 0; e < 4; ++e) v |= ((load_u32(qh + 4 * e) >> (2 * c)) & 0x03030303u) << (2 * e);
          store_u32(p + 2048 + 64 * i + 4 * r, v);
        }
        for (int j = 0; j < 4; ++j) std::memcpy(p + 3072 + 64 * j + 4 * r, block + 192 + 4 * j, 4);
        std::memcpy(p + 3328 + 2 * r, block + 208, 2);
      } else if (file == 8) {  // Q8_0: d, qs[32]; codes w + 128, 4 a step
        for (int st = 0; st < 8; ++st) store_u32(p + 64 * st + 4 * r, load_u32(block + 2 + 4 * st) ^ 0x80808080u);
        std::memcpy(p + 512 + 2 * r, block, 2);
      } else {  // Q5_0 (d, qh[4], qs[16]), Q4_1 (d, m, qs[16]): code k < 16 in qs[k]'s low nibble, else qs[k - 16]'s
        const uint8_t* qs = block + (file == 6 ? 6 : 4);
        for (int i = 0; i < 4; ++i) {
          const uint8_t* q = qs + 8 * (i & 1);
          store_u32(p + 64 * i + 4 * r, nibble_step(q, q + 4, i < 2 ? 0 : 4));
        }
        if (file == 6) {  // the fifth bits: bit k of qh -> bit k >> 2 of byte k & 3
          const uint32_t qh = load_u32(block + 2);
          uint32_t v = 0;
          for (int k = 0; k < 32; ++k) v |= ((qh >> k) & 1u) << (8 * (k & 3) + (k >> 2));
          store_u32(p + 256 + 4 * r, v);
          std::memcpy(p + 320 + 2 * r, block, 2);
        } else {
          std::memcpy(p + 256 + 4 * r, block, 4);
        }
      }
    }
  }
}

// The group of panels at `panels` (type: a panel layout, rb the file's row bytes) -> its 16 rows
// in the file's order at `rows`, one code at a time (the inverse of panels_of_group; not a decoding
// path: a kernel without a panel loop, a draft vocabulary's rows).
inline void blocks_from_panels(int32_t type, const uint8_t* panels, int64_t rb, uint8_t* rows) {
  const int32_t file = file_type(type);
  const int64_t bb = block_bytes(file), T = rb / bb, pb = kPanelRows * bb;
  if (file != 12 && file != 14) {
    for (int64_t t = 0; t < T; ++t) legacy_column_to_blocks(file, panels + t * pb, t, rows, rb);
    return;
  }
  const bool q4 = file == 12;
  for (int64_t t = 0; t < T; ++t) {
    const uint8_t* p = panels + t * pb;
    for (int r = 0; r < kPanelRows; ++r) {
      uint8_t* block = rows + r * rb + t * bb;
      // the code bytes are ORed in below; the scales and fp16 fields copied: (panel offset, block
      // offset, bytes)
      if (q4) std::memset(block + 16, 0, 128); else std::memset(block, 0, 192);
      auto field = [&](int64_t at, int64_t from, int n) { std::memcpy(block + from, p + at, n); };
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
        set_kquant_code(file, block, k, ((p[low] >> shift) & 15) | (q4 ? 0 : ((p[high] >> hshift) & 3) << 4));
      }
    }
  }
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
