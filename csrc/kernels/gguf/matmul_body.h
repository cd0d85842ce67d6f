// The GGUF matmul's loops, written once over a tier's vector primitives V, so that the portable,
// AVX2 and AVX-512 kernels perform the same operations on every output (the accumulation order
// of gguf_cpu.h). Each tier file includes this inside an anonymous namespace with its own target
// options in force (#pragma GCC target), and instantiates it with its V:
//
//   V::kRows          rows n of W one vector covers: 1 (portable, AVX2: 8 lanes = one row's 8
//                     accumulator lanes) or 2 (AVX-512: row n in lanes 0..7, row n + 1 in 8..15)
//   V::F, V::I        float / int32 vectors of 8 * kRows lanes
//   zero, mul, fma(a, b, c) = a * b + c once rounded, fnma(a, b, c) = c - a * b once rounded, add
//   x8(p)             x[p .. p + 7] in every row's lanes (x is shared by the rows n)
//   u8x8(p, stride)   bytes p[0..7] zero-extended (row r's from p + r * stride), s8x8 sign-extended
//   rows(v)           v[r] in row r's lanes; rows_i the same for int32
//   lane(v, s)        lane s of each row's 8 lanes, in all 8 of them
//   cvt, and_, or_, sub (with a constant), srli / slli (a count the unrolled loops make
//                     constant), srlv_lanes(a, base): lane j shifted right by base + j
//   hsum(v, out)      out[r] = h(row r's lanes) in gguf_cpu.h's order
//
// A tile is rows n .. n + kRows - 1 of W against MB consecutive rows of x: every weight vector is
// decoded once and used for the MB rows, whose accumulators stay in registers (MB is picked per
// tier so that they fit). Larger M runs several tiles over the same row of W, which is in L1 by
// then (a row is K / 256 * 144 bytes in Q4_K: 5 KiB at K = 8960).
//
//   W rows n, n+1 (AVX-512)       x rows m0 .. m0 + MB - 1
//   [blk 0][blk 1] ... [blk B-1]  ·  [x m0     ]  -> y[m0 .. m0+MB-1, n .. n+kRows-1]
//   [blk 0][blk 1] ... [blk B-1]     [x m0 + 1 ] ...
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/gguf/blocks.h"
#include "kernels/gguf/matmul_tiers.h"
#include "kernels/gguf/tile_rows.h"

#define SPECDEC_GGUF_UNROLL _Pragma("GCC unroll 16")
// Everything below inlines into the tile loop, so that arrays of vectors indexed by unrolled loop
// counters stay in registers.
#define SPECDEC_GGUF_INLINE __attribute__((always_inline)) inline

template <class V, int MB>
struct GgufTile {
  using F = typename V::F;
  using I = typename V::I;
  static constexpr int R = V::kRows;
  static constexpr bool kPrefetchInLoop = false;  // tile_rows prefetches ahead of each tile

  const MatmulArgs& a;
  int64_t n;   // first row of W
  int64_t m0;  // first row of x

  SPECDEC_GGUF_INLINE const float* xrow(int m) const { return a.x + (m0 + m) * a.K; }
  SPECDEC_GGUF_INLINE const float* xsum(int m) const { return a.xsum + (m0 + m) * (a.K / 32); }
  SPECDEC_GGUF_INLINE const uint8_t* block(int64_t b, int64_t bytes) const { return a.weight + n * a.row_bytes + b * bytes; }
  SPECDEC_GGUF_INLINE uint16_t u16(const uint8_t* p, int r) const {
    uint16_t v;
    std::memcpy(&v, p + r * a.row_bytes, sizeof(v));
    return v;
  }

  // y = h(A + B) + extra[m][r] for the tile's outputs.
  SPECDEC_GGUF_INLINE void store(const F* A, const F* B, const float (*extra)[R]) const {
    SPECDEC_GGUF_UNROLL
    for (int m = 0; m < MB; ++m) {
      float out[R];
      V::hsum(V::add(A[m], B[m]), out);
      for (int r = 0; r < R; ++r) a.y[(m0 + m) * a.ldy + n + r] = extra == nullptr ? out[r] : out[r] + extra[m][r];
    }
  }

  // P[m] = dot over the 4 weight vectors w[0..3] (32 weights) with x row m at offset k.
  SPECDEC_GGUF_INLINE static void dot32(const F* w, const float* const* xm, int64_t k, F* P) {
    SPECDEC_GGUF_UNROLL
    for (int m = 0; m < MB; ++m) {
      P[m] = V::mul(w[0], V::x8(xm[m] + k));
      P[m] = V::fma(w[1], V::x8(xm[m] + k + 8), P[m]);
      P[m] = V::fma(w[2], V::x8(xm[m] + k + 16), P[m]);
      P[m] = V::fma(w[3], V::x8(xm[m] + k + 24), P[m]);
    }
  }

  // ---- Q4_K: 256 weights, 144 bytes: d, dmin, scales[12] at 4, qs[128] at 16 --------------------
  SPECDEC_GGUF_INLINE void q4_k() const {
    F A[MB], B[MB];
    SPECDEC_GGUF_UNROLL
    for (int m = 0; m < MB; ++m) A[m] = B[m] = V::zero();
    const float* xm[MB];
    for (int m = 0; m < MB; ++m) xm[m] = xrow(m);
    const int64_t blocks = a.K / kQK_K;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = block(b, sizeof(BlockQ4_K));
      // Sub-block scales and mins as 8-lane vectors (lane s), d * sc_s and dmin * m_s rounded.
      float d[R], dmin[R];
      uint64_t sc[R], mn[R];
      for (int r = 0; r < R; ++r) {
        const uint8_t* p = blk + r * a.row_bytes;
        d[r] = half_to_float(u16(blk, r));
        dmin[r] = half_to_float(u16(blk + 2, r));
        q4k_scales_mins_bytes(p + 4, sc[r], mn[r]);
      }
      const F dsc = V::mul(V::cvt(V::u8x8(reinterpret_cast<const uint8_t*>(sc), 8)), V::rows(d));
      const F dmn = V::mul(V::cvt(V::u8x8(reinterpret_cast<const uint8_t*>(mn), 8)), V::rows(dmin));
      const uint8_t* qs = blk + 16;
      const int64_t k0 = b * kQK_K;
      SPECDEC_GGUF_UNROLL
      for (int c = 0; c < 4; ++c) {
        // Chunk c: the low nibbles of qs[32c ..] are sub-block 2c, the high ones sub-block 2c + 1.
        F P[MB], Q[MB];
        SPECDEC_GGUF_UNROLL
        for (int v = 0; v < 4; ++v) {
          const I raw = V::u8x8(qs + 32 * c + 8 * v, a.row_bytes);
          const F lo = V::cvt(V::and_(raw, 15)), hi = V::cvt(V::srli(raw, 4));
          SPECDEC_GGUF_UNROLL
          for (int m = 0; m < MB; ++m) {
            const float* x0 = xm[m] + k0 + 64 * c + 8 * v;
            if (v == 0) {
              P[m] = V::mul(lo, V::x8(x0));
              Q[m] = V::mul(hi, V::x8(x0 + 32));
            } else {
              P[m] = V::fma(lo, V::x8(x0), P[m]);
              Q[m] = V::fma(hi, V::x8(x0 + 32), Q[m]);
            }
          }
        }
        const F s0 = V::lane(dsc, 2 * c), s1 = V::lane(dsc, 2 * c + 1);
        SPECDEC_GGUF_UNROLL
        for (int m = 0; m < MB; ++m) {
          A[m] = V::fma(P[m], s0, A[m]);
          B[m] = V::fma(Q[m], s1, B[m]);
        }
      }
      // The mins, lane s = sub-block s: A[s] -= (dmin * m_s) * (sum of x over sub-block s).
      SPECDEC_GGUF_UNROLL
      for (int m = 0; m < MB; ++m) A[m] = V::fnma(dmn, V::x8(xsum(m) + 8 * b), A[m]);
    }
    store(A, B, nullptr);
  }

  // ---- Q6_K: 256 weights, 210 bytes: ql[128] at 0, qh[64] at 128, scales[16] at 192, d at 208 ---
  SPECDEC_GGUF_INLINE void q6_k() const {
    F A[MB], B[MB];
    SPECDEC_GGUF_UNROLL
    for (int m = 0; m < MB; ++m) A[m] = B[m] = V::zero();
    const float* xm[MB];
    for (int m = 0; m < MB; ++m) xm[m] = xrow(m);
    const int64_t blocks = a.K / kQK_K;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* blk = block(b, sizeof(BlockQ6_K));
      float d[R];
      for (int r = 0; r < R; ++r) d[r] = half_to_float(u16(blk + 208, r));
      // d * sc_s for s = 0..7 and 8..15, lane s & 7 (the int8 scales at 192 widen exactly).
      const F dsc[2] = {V::mul(V::cvt(V::s8x8(blk + 192, a.row_bytes)), V::rows(d)),
                        V::mul(V::cvt(V::s8x8(blk + 200, a.row_bytes)), V::rows(d))};
      const int64_t k0 = b * kQK_K;
      SPECDEC_GGUF_UNROLL
      for (int h = 0; h < 2; ++h) {
        SPECDEC_GGUF_UNROLL
        for (int i = 0; i < 4; ++i) {
          // Weights 128h + 32i + l: sub-block s = 8h + 2i for l < 16 (into A), s + 1 for l >= 16 (B).
          SPECDEC_GGUF_UNROLL
          for (int odd = 0; odd < 2; ++odd) {
            const int s = 8 * h + 2 * i + odd;
            F w[2];
            SPECDEC_GGUF_UNROLL
            for (int u = 0; u < 2; ++u) {
              const int l = 16 * odd + 8 * u;
              I low = V::u8x8(blk + 64 * h + 32 * (i & 1) + l, a.row_bytes);
              low = (i >> 1) ? V::srli(low, 4) : V::and_(low, 15);
              I high = V::u8x8(blk + 128 + 32 * h + l, a.row_bytes);
              high = V::slli(V::and_(V::srli(high, 2 * i), 3), 4);
              w[u] = V::cvt(V::sub(V::or_(low, high), 32));
            }
            const F sc = V::lane(dsc[h], s & 7);
            SPECDEC_GGUF_UNROLL
            for (int m = 0; m < MB; ++m) {
              const float* x0 = xm[m] + k0 + 16 * s;
              F P = V::mul(w[0], V::x8(x0));
              P = V::fma(w[1], V::x8(x0 + 8), P);
              if (odd == 0) {
                A[m] = V::fma(P, sc, A[m]);
              } else {
                B[m] = V::fma(P, sc, B[m]);
              }
            }
          }
        }
      }
    }
    store(A, B, nullptr);
  }

  // ---- Q8_0 / Q5_0 / Q4_1: 32 weights, even blocks into A, odd ones into B ------------------------

  // Block b's 4 weight vectors (k = 8v .. 8v + 7) and its scale d per row.
  SPECDEC_GGUF_INLINE void q8_0_weights(int64_t b, F* w, float* d) const {
    const uint8_t* blk = block(b, sizeof(BlockQ8_0));
    for (int r = 0; r < R; ++r) d[r] = half_to_float(u16(blk, r));
    SPECDEC_GGUF_UNROLL
    for (int v = 0; v < 4; ++v) w[v] = V::cvt(V::s8x8(blk + 2 + 8 * v, a.row_bytes));
  }
  SPECDEC_GGUF_INLINE void q5_0_weights(int64_t b, F* w, float* d) const {
    const uint8_t* blk = block(b, sizeof(BlockQ5_0));
    int32_t qh[R];
    for (int r = 0; r < R; ++r) {
      d[r] = half_to_float(u16(blk, r));
      std::memcpy(&qh[r], blk + r * a.row_bytes + 2, 4);
    }
    const I high_bits = V::rows_i(qh);
    SPECDEC_GGUF_UNROLL
    for (int v = 0; v < 4; ++v) {
      I low = V::u8x8(blk + 6 + 8 * (v & 1), a.row_bytes);
      low = (v >> 1) ? V::srli(low, 4) : V::and_(low, 15);
      const I high = V::slli(V::and_(V::srlv_lanes(high_bits, 8 * v), 1), 4);  // bit 8v + j of qh
      w[v] = V::cvt(V::sub(V::or_(low, high), 16));
    }
  }
  SPECDEC_GGUF_INLINE void q4_1_weights(int64_t b, F* w, float* d, float* mn) const {
    const uint8_t* blk = block(b, sizeof(BlockQ4_1));
    for (int r = 0; r < R; ++r) {
      d[r] = half_to_float(u16(blk, r));
      mn[r] = half_to_float(u16(blk + 2, r));
    }
    SPECDEC_GGUF_UNROLL
    for (int v = 0; v < 4; ++v) {
      const I raw = V::u8x8(blk + 4 + 8 * (v & 1), a.row_bytes);
      w[v] = V::cvt((v >> 1) ? V::srli(raw, 4) : V::and_(raw, 15));
    }
  }

  template <int kType>
  SPECDEC_GGUF_INLINE void block32(int64_t b, F* X, float (*S)[R]) const {
    F w[4];
    float d[R], mn[R];
    if constexpr (kType == 8) q8_0_weights(b, w, d);
    if constexpr (kType == 6) q5_0_weights(b, w, d);
    if constexpr (kType == 3) q4_1_weights(b, w, d, mn);
    const F sc = V::rows(d);
    const float* xm[MB];
    for (int m = 0; m < MB; ++m) xm[m] = xrow(m);
    F P[MB];
    dot32(w, xm, b * kQK, P);
    SPECDEC_GGUF_UNROLL
    for (int m = 0; m < MB; ++m) X[m] = V::fma(P[m], sc, X[m]);
    if constexpr (kType == 3) {
      for (int m = 0; m < MB; ++m) {
        const float xs = xsum(m)[b];
        for (int r = 0; r < R; ++r) S[m][r] = std::fma(mn[r], xs, S[m][r]);
      }
    }
  }

  template <int kType>
  SPECDEC_GGUF_INLINE void legacy() const {
    F A[MB], B[MB];
    SPECDEC_GGUF_UNROLL
    for (int m = 0; m < MB; ++m) A[m] = B[m] = V::zero();
    float S[MB][R] = {};
    const int64_t blocks = a.K / kQK;
    int64_t b = 0;
    for (; b + 1 < blocks; b += 2) {
      block32<kType>(b, A, S);
      block32<kType>(b + 1, B, S);
    }
    if (b < blocks) block32<kType>(b, A, S);
    store(A, B, kType == 3 ? S : nullptr);
  }
};

// Rows [n_begin, n_end) of y (n_end - n_begin a multiple of V::kRows), all M rows of x, in tiles
// of up to kMaxMB rows of x (tile_rows.h).
template <class V, int kMaxMB>
void gguf_rows(int32_t type, const MatmulArgs& a, int64_t M, int64_t n_begin, int64_t n_end) {
  static_assert(kMaxMB >= 1 && kMaxMB <= 4, "tiles of 1 to 4 rows of x are instantiated");
  tile_rows<GgufTile, V, kMaxMB>(type, a, M, n_begin, n_end);
}
