// GGUF (ggml) quantized blocks as stored in a .gguf file, and the dequantisation of one block,
// shared by the CPU and CUDA kernels (torch-free).
//
// A quantized weight [N, K] is stored row by row: row n is K / QK consecutive blocks, each a small
// struct of fp16 scales (kept here as raw uint16 bits) and packed integer codes. The five formats
// of the project's real models (the type ids are ggml's, as gguf.GGMLQuantizationType numbers them):
//
//   type  name  QK   bytes  weight k of the block                                  bits/weight
//    3    Q4_1   32    20   d * q + m,          q = nibble                            5.0
//    6    Q5_0   32    22   d * (q - 16),       q = nibble | qh bit << 4              5.5
//    8    Q8_0   32    34   d * q,              q = int8                              8.5
//   12    Q4_K  256   144   (d * sc_s) * q - (dmin * m_s), 8 sub-blocks s of 32      4.5
//   14    Q6_K  256   210   (d * sc_s) * (q - 32),  16 sub-blocks s of 16            6.5625
//
// Where the codes of weight k sit (k within the block):
//   Q4_1 / Q5_0: k < 16 in the low nibble of qs[k], k >= 16 in the high nibble of qs[k - 16];
//                Q5_0's fifth bit of weight k is bit k of qh (little-endian uint32).
//   Q4_K: 4 chunks c of 64 weights share qs[32c .. 32c + 31]: the low nibbles are sub-block 2c
//         (k = 64c + l), the high nibbles sub-block 2c + 1 (k = 64c + 32 + l), l = 0..31.
//         The 8 six-bit scales sc_s and mins m_s are packed in 12 bytes (q4k_scale_min below):
//           byte 0..3   sc_0..3 in bits 0..5, the top 2 bits of sc_4..7 in bits 6..7
//           byte 4..7   m_0..3 in bits 0..5, the top 2 bits of m_4..7 in bits 6..7
//           byte 8..11  low 4 bits of sc_4..7 (bits 0..3) and of m_4..7 (bits 4..7)
//   Q4_K_LANES (type 268, not a ggml type: this project's repacking of a Q4_K weight at load, for
//         the VNNI kernel's lane dots, kernels/gguf/q8_body.h): the same 144-byte blocks, d, dmin
//         and scales in place, the 256 codes permuted within qs so that a 32-byte chunk's nibbles
//         split straight into the lane-dot registers (no transpose per block): qs[32c + 4j + b]
//         holds code 8c + b of sub-block j (low nibble) and code 8c + 4 + b of sub-block j (high),
//         c = 0..3, j = 0..7, b = 0..3 (q4k_lanes_code). Values and results are Q4_K's, bit for bit.
//   Q6_K_LANES (type 270, likewise for Q6_K): ql, qh, scales and d where Q6_K has them, the 256
//         six-bit codes permuted among the places: the place of code 32i + l of half h (below)
//         holds code 4 (4h + i) + l % 4 of 32-weight group l / 4 (q6k_lanes_code), so the
//         kernel's decode of register 4h + i yields dword j = codes 4 (4h + i) .. + 3 of group j.
//   Q6_K: two halves h of 128 weights; in half h, weight 32i + l (i = 0..3, l = 0..31) has
//           low 4 bits  ql[64h + l + 32 (i & 1)] >> 4 (i >> 1)     (i = 0, 1 low nibble; 2, 3 high)
//           high 2 bits (qh[32h + l] >> 2i) & 3
//         and its sub-block is s = 8h + 2i + l / 16, scale int8 scales[s].
//
// The dequantised value is computed in float32 with exactly the operations and rounding order of
// ggml's reference dequantizer (and of gguf-py's gguf.quants.dequantize, which the tests hold this
// to bit for bit): the scale products d * sc and dmin * m are rounded first, then one multiply and
// one add / subtract, each rounded (no fused multiply-add: on CUDA the _rn intrinsics forbid the
// contraction; the CPU callers are compiled for baseline x86-64, which has no FMA to contract to).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/common/dtype.h"
#include "kernels/common/hd.h"
#include "kernels/common/rounding.h"

namespace specdec::gguf {

// ggml type ids (GGMLQuantizationType) of the supported formats.
enum class Type : int32_t { kQ4_1 = 3, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14 };
// The project's own layouts (not in a file): Q4_K / Q6_K with their codes in lane-dot order, and
// the same formats in panels of 16 rows (kernels/gguf/panels.h).
inline constexpr int32_t kQ4_K_Lanes = 268;
inline constexpr int32_t kQ6_K_Lanes = 270;
inline constexpr int32_t kQ4_1_Panels = 515;  // 512 + the file format's id
inline constexpr int32_t kQ5_0_Panels = 518;
inline constexpr int32_t kQ8_0_Panels = 520;
inline constexpr int32_t kQ4_K_Panels = 524;
inline constexpr int32_t kQ6_K_Panels = 526;

// Whether ``type`` is one of the lane-order layouts (the one question every kernel asks of them).
SPECDEC_HD bool is_lanes(int32_t type) { return type == kQ4_K_Lanes || type == kQ6_K_Lanes; }

// Whether ``type`` is one of the panel layouts: rows interleaved in groups of 16 (panels.h).
SPECDEC_HD bool is_panels(int32_t type) {
  return type == kQ4_1_Panels || type == kQ5_0_Panels || type == kQ8_0_Panels || type == kQ4_K_Panels ||
         type == kQ6_K_Panels;
}

// The file format a lane-order or panel layout holds (a file format: itself).
SPECDEC_HD int32_t file_type(int32_t type) {
  if (is_panels(type)) return type - 512;
  return type == kQ4_K_Lanes ? 12 : type == kQ6_K_Lanes ? 14 : type;
}

inline constexpr int kQK = 32;     // weights per block of the legacy formats
inline constexpr int kQK_K = 256;  // weights per k-quant super-block

struct BlockQ4_1 {
  uint16_t d;       // fp16 scale
  uint16_t m;       // fp16 offset (the block's minimum)
  uint8_t qs[16];   // weight k: nibble k & 15 of qs[k & 15] (low for k < 16)
};
struct BlockQ5_0 {
  uint16_t d;       // fp16 scale
  uint8_t qh[4];    // bit k = fifth bit of weight k (little-endian uint32)
  uint8_t qs[16];   // low 4 bits, as Q4_1
};
struct BlockQ8_0 {
  uint16_t d;       // fp16 scale
  int8_t qs[32];
};
struct BlockQ4_K {
  uint16_t d;          // fp16 super-scale of the 6-bit sub-block scales
  uint16_t dmin;       // fp16 super-scale of the 6-bit sub-block mins
  uint8_t scales[12];  // 8 scales + 8 mins, 6 bits each (layout above)
  uint8_t qs[128];     // 4-bit codes, chunk c = qs[32c .. 32c + 31] (layout above)
};
struct BlockQ6_K {
  uint8_t ql[128];     // low 4 bits
  uint8_t qh[64];      // high 2 bits
  int8_t scales[16];   // 8-bit sub-block scales
  uint16_t d;          // fp16 super-scale
};

static_assert(sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 && sizeof(BlockQ8_0) == 34 &&
                  sizeof(BlockQ4_K) == 144 && sizeof(BlockQ6_K) == 210,
              "GGUF block structs must match the file layout byte for byte");
static_assert(alignof(BlockQ4_1) == 2 && alignof(BlockQ5_0) == 2 && alignof(BlockQ8_0) == 2 &&
                  alignof(BlockQ4_K) == 2 && alignof(BlockQ6_K) == 2,
              "blocks are packed back to back; 2-byte alignment is all a row of them guarantees");

// Weights per block and bytes per block of a format; 0 for an unsupported type id.
SPECDEC_HD int block_weights(int32_t type) {
  switch (type) {
    case 3: case 6: case 8: case kQ4_1_Panels: case kQ5_0_Panels: case kQ8_0_Panels: return kQK;
    case 12: case 14: case kQ4_K_Lanes: case kQ6_K_Lanes: case kQ4_K_Panels: case kQ6_K_Panels: return kQK_K;
    default: return 0;
  }
}
SPECDEC_HD int block_bytes(int32_t type) {
  switch (type) {
    case 3: case kQ4_1_Panels: return sizeof(BlockQ4_1);
    case 6: case kQ5_0_Panels: return sizeof(BlockQ5_0);
    case 8: case kQ8_0_Panels: return sizeof(BlockQ8_0);
    case 12: case kQ4_K_Lanes: case kQ4_K_Panels: return sizeof(BlockQ4_K);
    case 14: case kQ6_K_Lanes: case kQ6_K_Panels: return sizeof(BlockQ6_K);
    default: return 0;
  }
}

SPECDEC_HD float half_to_float(uint16_t bits) { return to_float(Half16{bits}); }

// Six-bit scale and min of sub-block s (0..7) of a Q4_K block (packing in the file comment).
SPECDEC_HD void q4k_scale_min(const uint8_t* scales, int s, int& sc, int& m) {
  if (s < 4) {
    sc = scales[s] & 63;
    m = scales[s + 4] & 63;
  } else {
    sc = (scales[s + 4] & 15) | ((scales[s - 4] >> 6) << 4);
    m = (scales[s + 4] >> 4) | ((scales[s] >> 6) << 4);
  }
}

// All 8 scales (sc) and mins (mn) of a Q4_K block at once, byte s = sub-block s (the same values
// as q4k_scale_min, from 32-bit words: the vector kernels widen them 8 at a time).
SPECDEC_HD void q4k_scales_mins_bytes(const uint8_t* scales, uint64_t& sc, uint64_t& mn) {
  uint32_t w0, w1, w2;
  std::memcpy(&w0, scales, 4);
  std::memcpy(&w1, scales + 4, 4);
  std::memcpy(&w2, scales + 8, 4);
  const uint32_t sc_lo = w0 & 0x3f3f3f3fu, mn_lo = w1 & 0x3f3f3f3fu;  // sub-blocks 0..3
  const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);  // 4..7: low 4 bits + top 2
  const uint32_t mn_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
  sc = static_cast<uint64_t>(sc_lo) | static_cast<uint64_t>(sc_hi) << 32;
  mn = static_cast<uint64_t>(mn_lo) | static_cast<uint64_t>(mn_hi) << 32;
}

// ---- 32 weights at a time -> floats ----------------------------------------------------------------
// The unit both devices dequantise: a legacy block, a Q4_K sub-block, a quarter of a Q6_K half.

SPECDEC_HD void dequantize_group(const BlockQ4_1& b, float* out) {
  const float d = half_to_float(b.d), m = half_to_float(b.m);
  for (int j = 0; j < 16; ++j) {
    out[j] = add_rn(mul_rn(d, static_cast<float>(b.qs[j] & 15)), m);
    out[j + 16] = add_rn(mul_rn(d, static_cast<float>(b.qs[j] >> 4)), m);
  }
}

SPECDEC_HD void dequantize_group(const BlockQ5_0& b, float* out) {
  const float d = half_to_float(b.d);
  const uint32_t qh = static_cast<uint32_t>(b.qh[0]) | static_cast<uint32_t>(b.qh[1]) << 8 |
                      static_cast<uint32_t>(b.qh[2]) << 16 | static_cast<uint32_t>(b.qh[3]) << 24;
  for (int j = 0; j < 16; ++j) {
    const int lo = (b.qs[j] & 15) | static_cast<int>((qh >> j) & 1) << 4;
    const int hi = (b.qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
    out[j] = mul_rn(d, static_cast<float>(lo - 16));
    out[j + 16] = mul_rn(d, static_cast<float>(hi - 16));
  }
}

SPECDEC_HD void dequantize_group(const BlockQ8_0& b, float* out) {
  const float d = half_to_float(b.d);
  for (int j = 0; j < 32; ++j) out[j] = mul_rn(static_cast<float>(b.qs[j]), d);
}

// Sub-block s (0..7): weights 32s .. 32s + 31.
SPECDEC_HD void dequantize_group(const BlockQ4_K& b, int s, float* out) {
  int sc, m;
  q4k_scale_min(b.scales, s, sc, m);
  const float ds = mul_rn(half_to_float(b.d), static_cast<float>(sc));
  const float dm = mul_rn(half_to_float(b.dmin), static_cast<float>(m));
  const uint8_t* q = b.qs + 32 * (s >> 1);
  const int shift = 4 * (s & 1);
  for (int l = 0; l < 32; ++l) out[l] = add_rn(mul_rn(ds, static_cast<float>((q[l] >> shift) & 15)), -dm);
}

// Code k (0..31) of sub-block s of a Q4_K_LANES block's qs (layout in the file comment).
SPECDEC_HD int q4k_lanes_code(const uint8_t* qs, int s, int k) {
  return (qs[32 * (k >> 3) + 4 * s + (k & 3)] >> (4 * ((k >> 2) & 1))) & 15;
}

// A Q4_K block's 128 code bytes -> the same codes in Q4_K_LANES order (`lanes`, 128 bytes).
SPECDEC_HD void q4k_qs_to_lanes(const uint8_t* qs, uint8_t* lanes) {
  for (int c = 0; c < 4; ++c)
    for (int j = 0; j < 8; ++j)
      for (int b = 0; b < 4; ++b) {
        const int lo = (qs[32 * (j >> 1) + 8 * c + b] >> (4 * (j & 1))) & 15;
        const int hi = (qs[32 * (j >> 1) + 8 * c + 4 + b] >> (4 * (j & 1))) & 15;
        lanes[32 * c + 4 * j + b] = static_cast<uint8_t>(lo | hi << 4);
      }
}

// The inverse: Q4_K_LANES code bytes -> the file's Q4_K order.
SPECDEC_HD void q4k_qs_from_lanes(const uint8_t* lanes, uint8_t* qs) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      qs[32 * c + l] = static_cast<uint8_t>(q4k_lanes_code(lanes, 2 * c, l) | q4k_lanes_code(lanes, 2 * c + 1, l) << 4);
}

// Sub-block s (0..7) of a Q4_K_LANES block: Q4_K's values, the codes read through the permutation.
SPECDEC_HD void dequantize_group_lanes(const BlockQ4_K& b, int s, float* out) {
  int sc, m;
  q4k_scale_min(b.scales, s, sc, m);
  const float ds = mul_rn(half_to_float(b.d), static_cast<float>(sc));
  const float dm = mul_rn(half_to_float(b.dmin), static_cast<float>(m));
  for (int l = 0; l < 32; ++l) out[l] = add_rn(mul_rn(ds, static_cast<float>(q4k_lanes_code(b.qs, s, l))), -dm);
}

// Code of weight 32i + l of half h of a Q6_K block, already minus 32 (-32..31).
SPECDEC_HD int q6k_code(const BlockQ6_K& b, int h, int i, int l) {
  const int low = (b.ql[64 * h + l + 32 * (i & 1)] >> (4 * (i >> 1))) & 15;
  const int high = (b.qh[32 * h + l] >> (2 * i)) & 3;
  return (low | high << 4) - 32;
}

// Code k (0..31) of 32-weight group g of a Q6_K_LANES block, minus 32 (layout in the file comment).
SPECDEC_HD int q6k_lanes_code(const BlockQ6_K& b, int g, int k) {
  return q6k_code(b, k >> 4, (k >> 2) & 3, 4 * g + (k & 3));
}

// A Q6_K block's codes -> Q6_K_LANES (from_lanes: the inverse); scales and d copied.
SPECDEC_HD void q6k_recode(const BlockQ6_K& in, BlockQ6_K& out, bool from_lanes) {
  for (int i = 0; i < 128; ++i) out.ql[i] = 0;
  for (int i = 0; i < 64; ++i) out.qh[i] = 0;
  for (int i = 0; i < 16; ++i) out.scales[i] = in.scales[i];
  out.d = in.d;
  for (int g = 0; g < 8; ++g)
    for (int k = 0; k < 32; ++k) {
      // code k of group g: the file's place (h, i, l) = (g / 4, g % 4, k); the lanes' place
      // (k / 16, k / 4 % 4, 4 g + k % 4)
      const int h = g >> 2, i = g & 3, lh = k >> 4, li = (k >> 2) & 3, lp = 4 * g + (k & 3);
      const int v = (from_lanes ? q6k_lanes_code(in, g, k) : q6k_code(in, h, i, k)) + 32;  // 0..63
      const int th = from_lanes ? h : lh, ti = from_lanes ? i : li, tl = from_lanes ? k : lp;
      out.ql[64 * th + tl + 32 * (ti & 1)] |= static_cast<uint8_t>((v & 15) << (4 * (ti >> 1)));
      out.qh[32 * th + tl] |= static_cast<uint8_t>((v >> 4) << (2 * ti));
    }
}

// `bytes` (whole blocks) of a lane-order layout (`type`: Q4_K_LANES, Q6_K_LANES) at src -> the same
// blocks in the file's order at dst: where a kernel without a lane-order loop meets a repacked
// weight (scalar; not a decoding path).
SPECDEC_HD void blocks_from_lanes(int32_t type, const uint8_t* src, int64_t bytes, uint8_t* dst) {
  if (type == kQ4_K_Lanes) {
    for (int64_t b = 0; b < bytes; b += sizeof(BlockQ4_K)) {
      for (int i = 0; i < 16; ++i) dst[b + i] = src[b + i];  // d, dmin, scales
      q4k_qs_from_lanes(src + b + 16, dst + b + 16);
    }
  } else {
    for (int64_t b = 0; b < bytes; b += sizeof(BlockQ6_K)) {
      BlockQ6_K in, out;
      std::memcpy(&in, src + b, sizeof(in));
      q6k_recode(in, out, true);
      std::memcpy(dst + b, &out, sizeof(out));
    }
  }
}

// Group g (0..7): weights 32g .. 32g + 31 = half h = g / 4, i = g % 4 (sub-blocks 2g and 2g + 1).
// `lanes`: a Q6_K_LANES block (the codes read through its permutation).
SPECDEC_HD void dequantize_group(const BlockQ6_K& b, int g, float* out, bool lanes = false) {
  const float d = half_to_float(b.d);
  const float ds0 = mul_rn(d, static_cast<float>(b.scales[2 * g]));
  const float ds1 = mul_rn(d, static_cast<float>(b.scales[2 * g + 1]));
  for (int l = 0; l < 32; ++l) {
    const int q = lanes ? q6k_lanes_code(b, g, l) : q6k_code(b, g >> 2, g & 3, l);
    out[l] = mul_rn(l < 16 ? ds0 : ds1, static_cast<float>(q));
  }
}

// Group g (weights 32g .. 32g + 31) of one row of a weight stored as blocks of `type`, whose
// blocks start at `row`. The type must be supported (block_weights(type) > 0).
SPECDEC_HD void dequantize_group32(int32_t type, const uint8_t* row, int64_t g, float* out) {
  switch (type) {
    case 3: dequantize_group(reinterpret_cast<const BlockQ4_1*>(row)[g], out); break;
    case 6: dequantize_group(reinterpret_cast<const BlockQ5_0*>(row)[g], out); break;
    case 8: dequantize_group(reinterpret_cast<const BlockQ8_0*>(row)[g], out); break;
    case 12: dequantize_group(reinterpret_cast<const BlockQ4_K*>(row)[g / 8], static_cast<int>(g % 8), out); break;
    case kQ4_K_Lanes:
      dequantize_group_lanes(reinterpret_cast<const BlockQ4_K*>(row)[g / 8], static_cast<int>(g % 8), out);
      break;
    case kQ6_K_Lanes:
      dequantize_group(reinterpret_cast<const BlockQ6_K*>(row)[g / 8], static_cast<int>(g % 8), out, true);
      break;
    default: dequantize_group(reinterpret_cast<const BlockQ6_K*>(row)[g / 8], static_cast<int>(g % 8), out); break;
  }
}

// Row `row` of a weight [N, K] stored as blocks of `type` -> K floats; false for an unknown type.
SPECDEC_HD bool dequantize_row(int32_t type, const uint8_t* weight, int64_t K, int64_t row, float* out) {
  const int qk = block_weights(type);
  if (qk == 0) return false;
  const uint8_t* base = weight + row * (K / qk) * block_bytes(type);
  for (int64_t g = 0; g < K / 32; ++g) dequantize_group32(type, base, g, out + 32 * g);
  return true;
}

}  // namespace specdec::gguf
