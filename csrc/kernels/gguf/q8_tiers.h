// Internal to the Q8-activation GGUF matmul (q8.h): what the dispatcher (q8_cpu.cpp) hands each
// ISA tier (the portable loop there, q8_avx2.cpp, q8_avx512.cpp, q8_avx512_vnni.cpp).
#pragma once

#include <cstdint>

namespace specdec::gguf {

struct Q8Args {
  const uint8_t* xq;       // [M, xq_row_bytes]: the Q8 activations (q8.h)
  int64_t xq_row_bytes;    // q8_row_bytes(K)
  int64_t K;
  const uint8_t* weight;   // N rows of row_bytes = K / QK * block bytes
  int64_t row_bytes;
  float* y;                // y[m * ldy + n]
  int64_t ldy;
  // Optional (nullptr: absent), for the lane dots (q8_body.h): row m's codes with each octet's (a
  // k-quant super-block's, 8 legacy blocks') 8 x 8 dwords transposed and each 32-byte chunk stored twice (a zmm's two row
  // halves take the same x, and a full 64-byte load is vpdpbusd's memory operand, where a broadcast
  // cost a shuffle: 8-row tiles 17% faster), xt[512 T m + 512 t + 64 i + 32 h + 4 j + b] = code
  // 32 j + 4 i + b of octet t (a super-block; T = octets(), so 512 T = 2K where K is a multiple of
  // 256), h = 0, 1, and 0 past K (transpose_codes, q8_avx512_vnni.cpp, which also serves the legacy
  // formats' lane dots there; the AVX2 tier writes and reads h = 0 only, q8_avx2.cpp).
  const int8_t* xt = nullptr;
  // With xt: W's codes are already in lane order (Q4_K_LANES, Q6_K_LANES, blocks.h), so the lane
  // dots skip the per-block transpose. Only the VNNI tier's two-row tiles read it.
  bool w_lanes = false;
  // Optional, for the AVX-512 tiers' plain bodies: row m's codes in their own order, each 32-byte
  // group stored twice over (xd[2 m K + 64 g + 32 h + i] = code 32 g + i, h = 0, 1), so a group is
  // one 64-byte load for both rows of W instead of a broadcast.
  const int8_t* xd = nullptr;

  // Row m's codes [K], scales [8 T] and half sums [16 T] (T = octets, q8.h).
  int64_t octets() const { return (K / 32 + 7) / 8; }
  const int8_t* codes(int64_t m) const { return reinterpret_cast<const int8_t*>(xq + m * xq_row_bytes); }
  const float* scales(int64_t m) const { return reinterpret_cast<const float*>(xq + m * xq_row_bytes + K); }
  const int8_t* codes_t(int64_t m) const { return xt + m * 512 * octets(); }
  const int16_t* sums(int64_t m) const {
    return reinterpret_cast<const int16_t*>(xq + m * xq_row_bytes + K + 32 * octets());
  }
};

// Rows [n_begin, n_end) of y for all M rows of x.
void matmul_q8_rows_portable(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end);
void matmul_q8_rows_avx2(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end);
void matmul_q8_rows_avx512(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end);
void matmul_q8_rows_avx512_vnni(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end);

// The legacy formats (file order: q8k.h's legacy order only; their panel layouts: either) with 16
// rows of W in the vector lanes, AVX-512 VNNI (legacy_lanes_avx512_vnni.cpp): q8_order, q8.h's
// float order (decoding), else q8k.h's legacy order (a prompt's prefill).
void legacy_lanes_rows(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end, bool q8_order);

}  // namespace specdec::gguf
