// Attention over the hierarchical 4-bit KV cache plus its full-precision buffer: the pieces both
// the CPU kernel (quant_attention_cpu.cpp) and the CUDA kernel (quant_attention_cuda.cu) run.
//
// One row b, one KV head h, token t of the sequence (0 .. lengths[b] + n - 1) is read from
//   * the quantised storage (hierarchical codes, csrc/kernels/kv_quant/hier4.h) when
//     t < quant_len[b, i], i the query: each query has its own boundary (a function of its
//     position, so a verification forward and autoregressive decoding read a token the same way);
//   * the full-precision buffer, slot t - buffer_start[b], otherwise.
// Token t is visible to new token i when t < lengths[b] (the committed prefix), or t = lengths[b]
// + j with j == i, or j < i without a tree mask, or tree_mask[b, i, j] with one.
//
// Storage (Tc = cache capacity, F = buffer slots, Gk / Gv the key / value group sizes):
//   k_upper, k_lower, v_upper, v_lower: [B, Hkv, Tc, D/2] uint8, channel 2c in the low nibble
//   k_scale, k_zero: [B, Hkv, Tc/Gk, D] float32      v_scale, v_zero: [B, Hkv, Tc, D/Gv] float32
//   k_buffer, v_buffer: [B, Hkv, F, D] float32 (q and out are float32 too: the glue converts)
#pragma once

#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/hd.h"
#include "kernels/kv_quant/hier4.h"

namespace specdec::qattn {

// Everything one launch reads; sizes in elements. Tensors are contiguous in the layouts above.
struct Args {
  const float* q;            // [B, Hq, n, D]
  const uint8_t* k_upper;
  const uint8_t* k_lower;
  const float* k_scale;
  const float* k_zero;
  const uint8_t* v_upper;
  const uint8_t* v_lower;
  const float* v_scale;
  const float* v_zero;
  const float* k_buffer;     // [B, Hkv, F, D]
  const float* v_buffer;
  const int64_t* quant_len;     // [B, n] tokens read from the quantised storage, per query
  const int64_t* buffer_start;  // [B] token held by buffer slot 0
  const int64_t* lengths;       // [B] committed tokens; new token j sits at lengths[b] + j
  const bool* tree_mask;        // [B, n, n] or nullptr (causal among the new tokens)
  float* out;                       // [B, Hq, n, D]
  int64_t B, Hq, Hkv, n, D, capacity, F, key_group, value_group;
  bool use_lower;
  float sm_scale;  // softmax scale, usually 1/sqrt(D)
};

// Is token t visible to new token i of row b (t < lengths[b] + n)?
SPECDEC_HD bool visible(const Args& a, int64_t b, int64_t i, int64_t t) {
  const int64_t j = t - a.lengths[b];
  if (j < 0) return true;
  if (j == i) return true;
  if (a.tree_mask == nullptr) return j < i;
  return a.tree_mask[(b * a.n + i) * a.n + j];
}

// The last token new token i of row b can see (the tokens after it are all masked).
SPECDEC_HD int64_t last_seen(const Args& a, int64_t b, int64_t i) {
  return a.lengths[b] + (a.tree_mask == nullptr ? i : a.n - 1);
}

// Channel d of token t's key from the quantised storage of (row b, KV head h). The caller keeps
// t < capacity.
SPECDEC_HD float quant_key(const Args& a, int64_t bh, int64_t t, int64_t d) {
  const int64_t byte = (bh * a.capacity + t) * (a.D / 2) + d / 2;
  const int shift = (d & 1) * 4;
  const int64_t param = (bh * (a.capacity / a.key_group) + t / a.key_group) * a.D + d;
  return kv::dequantize_one((a.k_upper[byte] >> shift) & 15u, a.use_lower ? (a.k_lower[byte] >> shift) & 15u : 8u,
                            a.k_scale[param], a.k_zero[param], a.use_lower);
}

// Channel d of token t's value from the quantised storage (values grouped along channels).
SPECDEC_HD float quant_value(const Args& a, int64_t bh, int64_t t, int64_t d) {
  const int64_t byte = (bh * a.capacity + t) * (a.D / 2) + d / 2;
  const int shift = (d & 1) * 4;
  const int64_t param = (bh * a.capacity + t) * (a.D / a.value_group) + d / a.value_group;
  return kv::dequantize_one((a.v_upper[byte] >> shift) & 15u, a.use_lower ? (a.v_lower[byte] >> shift) & 15u : 8u,
                            a.v_scale[param], a.v_zero[param], a.use_lower);
}

// Where token t of row b can be read: from the quantised storage (t < capacity) and / or from the
// buffer (0 <= t - buffer_start < F). A token outside both is skipped (never read out of bounds;
// the Python side makes every visible token readable).
SPECDEC_HD bool in_quant(const Args& a, int64_t t) { return t < a.capacity; }
SPECDEC_HD bool in_buffer(const Args& a, int64_t b, int64_t t) {
  const int64_t s = t - a.buffer_start[b];
  return s >= 0 && s < a.F;
}

// Online softmax: fold a block's scores into the running max m and sum l. Returns the factor the
// old accumulator is multiplied by; -inf scores (masked) contribute nothing.
SPECDEC_HD float neg_inf() { return -bits_to_float(0x7f800000u); }

SPECDEC_HD float exp_shifted(float s, float m) {
  if (s == neg_inf()) return 0.f;
#if defined(__CUDA_ARCH__)
  return expf(s - m);
#else
  return std::exp(s - m);
#endif
}

SPECDEC_HD float online_rescale(float& m, float block_max) {
  if (!(block_max > m)) return 1.f;
  const float old = m;
  m = block_max;
  return exp_shifted(old, block_max);  // 0 when nothing was visible before
}

}  // namespace specdec::qattn

namespace specdec::qattn {

// Key of token t (all D channels) from the quantised storage of slab bh = b * Hkv + h.
// out: D floats. Keys are grouped along tokens, so one row of scale / zero serves the token.
SPECDEC_HD void quant_key_row(const Args& a, int64_t bh, int64_t t, float* out) {
  const int64_t half = a.D / 2;
  const uint8_t* up = a.k_upper + (bh * a.capacity + t) * half;
  const uint8_t* lo = a.k_lower + (bh * a.capacity + t) * half;
  const int64_t param = (bh * (a.capacity / a.key_group) + t / a.key_group) * a.D;
  const float* sc = a.k_scale + param;
  const float* ze = a.k_zero + param;
  for (int64_t c = 0; c < half; ++c)
    kv::dequantize_byte(up[c], a.use_lower ? lo[c] : uint8_t{0x88}, sc[2 * c], ze[2 * c], sc[2 * c + 1],
                        ze[2 * c + 1], a.use_lower, out + 2 * c);
}

// Value of token t (all D channels); both channels of a byte share a group (value_group is even).
SPECDEC_HD void quant_value_row(const Args& a, int64_t bh, int64_t t, float* out) {
  const int64_t half = a.D / 2;
  const uint8_t* up = a.v_upper + (bh * a.capacity + t) * half;
  const uint8_t* lo = a.v_lower + (bh * a.capacity + t) * half;
  const int64_t groups = a.D / a.value_group;
  const float* sc = a.v_scale + (bh * a.capacity + t) * groups;
  const float* ze = a.v_zero + (bh * a.capacity + t) * groups;
  for (int64_t c = 0; c < half; ++c) {
    const int64_t g = 2 * c / a.value_group;
    kv::dequantize_byte(up[c], a.use_lower ? lo[c] : uint8_t{0x88}, sc[g], ze[g], sc[g], ze[g], a.use_lower,
                        out + 2 * c);
  }
}

}  // namespace specdec::qattn
