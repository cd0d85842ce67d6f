// The Q8-activation matmul's loops (q8.h), written once over a tier's integer / float vector
// primitives V so that the AVX2 and AVX-512 tiers run the same integer sums and the same float
// steps on every output. Each tier file includes this inside an anonymous namespace with its own
// target options in force, and instantiates it with its V:
//
//   V::kRows        rows n of W one vector covers: 1 (AVX2: a ymm is one row's 32 bytes / 8
//                   lanes) or 2 (AVX-512: row n in the low 256 bits, row n + 1 in the high ones)
//   V::I, V::F      per row: 32 bytes (or 16 int16 / 8 int32), 8 float32 lanes
//   wload(p, st)    32 weight bytes per row (row r's at p + r * st); wnib16: 16 bytes -> their low
//                   nibbles then their high nibbles; wbit5: byte i = 16 where bit i of the uint32
//                   at p is set (Q5_0's fifth bit), else 0
//   xload, xs16, xf 32 code bytes / 16 int16 sums / 8 floats of x, the same for every row n
//   maddubs(u, s)   u8 x s8 -> int16 sums of adjacent pairs (no saturation can occur: |codes|
//                   <= 127 and the weight bytes are small, see each format); madd: int16 -> int32
//   dot4(u, s)      u8 x s8 -> int32 sums of 4 adjacent products: madd(maddubs(u, s), ones16),
//                   or one VNNI vpdpbusd (the same integers, as maddubs cannot saturate)
//   reduce8(m[8])   lane j = the sum of m[j]'s 8 int32 lanes (exact); reduce8_i16(p[8], c): lane j =
//                   c_j * the sum of p[j]'s 16 int16 lanes (c = pairs16 of the factors), for codes
//                   whose sums of 8 int16 lanes fit an int16
//   pairs16(b)      int16 b0 b0 b1 b1 .. b7 b7 of the 8 bytes b[r]
//   q6_scales(p,st) Q6_K's 16 int8 scales as int16; q6_half_scales(p, st, s0123, s4567): the same
//                   scales as int32 in the lane order reduce8_halves(m, s0123, s4567) applies them
//                   (lane j = s_2j x the sum of m[j]'s low 128 bits + s_2j+1 x its high ones)
//   halves8(p, step, st, cnt)  lane j < cnt = the fp16 at p + j * step widened, else 0; h2f one
//                   fp16 widened (both exact, as blocks.h's half_to_float, NaN payloads aside)
//
// Where V::kLaneDots (the Q4_K / Q6_K lane dots below, against x's transposed codes Q8Args::xt):
//   transpose8(w)   per row of W, the 8 x 8 dword transpose of w[0..7]
//   q4_lane_scales(b), q4_lane_dot(w, q, c)  lane j = sc_j Σ w q over sub-block j, from the lane-
//                   order w[8] and the transposed codes at q (chunk i at q + 64 i), c the scales as
//                   q4_lane_scales makes them from the 8 bytes b[r]
//   q6_lane_scales(p, st, lo, hi), q6_lane_sums(w, q, lo, hi)  lane j = sc_2j Σ over sub-block j's
//                   first 16 codes (w[0..3]) + sc_2j+1 Σ over its last 16 (w[4..7]) of (w + 32) q
// and, in two-row tiles (the legacy formats' lane dots, octet_body<kType, true>):
//   legacy_lane_dot(w, q)  lane j = Σ w q over block j of the octet, w transposed (unsigned codes)
//   flip8(w)        Q8_0's signed codes + 128 (an xor of the sign bit), for vpdpbusd's u8 operand
//
// A tile is rows n .. n + kRows - 1 of W against MB consecutive rows of x: each octet of W (a
// k-quant super-block, 8 legacy blocks) is decoded once into registers (spilled to L1 where they
// do not fit) and used for the MB rows, whose one accumulator each stays in a register.
//
//   W row n: [octet 0][octet 1] ... [octet T-1]   x rows m0 .. m0 + MB - 1 (Q8: codes, d, sums)
//            decode octet t once  ---------->     A[m] += per-lane float steps of q8.h
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/gguf/blocks.h"
#include "kernels/gguf/q8_tiers.h"
#include "kernels/gguf/tile_rows.h"

#define SPECDEC_Q8_UNROLL _Pragma("GCC unroll 16")
#define SPECDEC_Q8_INLINE __attribute__((always_inline)) inline

template <class V, int MB>
struct Q8Tile {
  using F = typename V::F;
  using I = typename V::I;
  static constexpr int R = V::kRows;
  static constexpr bool kPrefetchInLoop = true;  // long tiles: prefetch() in the block loops

  const Q8Args& a;
  int64_t n;   // first row of W
  int64_t m0;  // first row of x

  SPECDEC_Q8_INLINE const uint8_t* wrow() const { return a.weight + n * a.row_bytes; }
  SPECDEC_Q8_INLINE uint16_t u16(const uint8_t* p, int r) const {
    uint16_t v;
    std::memcpy(&v, p + r * a.row_bytes, sizeof(v));
    return v;
  }

  // Where the tile is long (tile_rows.h), W's bytes kPrefetchBytes ahead of the `bytes` at offset
  // off of each of its rows, which the loop is about to read.
  SPECDEC_Q8_INLINE void prefetch(bool in_loop, int64_t off, int64_t bytes) const {
    if (in_loop) prefetch_ahead(wrow(), R, a.row_bytes, off, bytes);
  }

  // The 32 codes of row m of x from code k (a multiple of 32): where the tier keeps them stored
  // twice over (Q8Args::xd, two-row tiers), one 64-byte load; else the tier's xload.
  SPECDEC_Q8_INLINE I xcodes(int64_t m, int64_t k) const {
    if constexpr (R == 2) {
      if (a.xd != nullptr) return V::xtload(a.xd + 2 * (m * a.K + k));
    }
    return V::xload(a.codes(m) + k);
  }

  SPECDEC_Q8_INLINE void store(const F* A) const {
    SPECDEC_Q8_UNROLL
    for (int m = 0; m < MB; ++m) {
      float out[R];
      V::hsum(A[m], out);
      for (int r = 0; r < R; ++r) a.y[(m0 + m) * a.ldy + n + r] = out[r];
    }
  }

  // ---- Q4_K: 144 bytes: d @0, dmin @2, scales[12] @4, qs[128] @16 ---------------------------
  // maddubs pairs <= 2 * 15 * 127, so the reduce runs in int16 (reduce8_i16); lane s of the dot =
  // sc_s * Σ w q (exact in int32).
  //
  // Lane dots (kLanes: V::kLaneDots and x's codes transposed, Q8Args::xt): the weight registers
  // w[s] (sub-block s of rows n (, n + 1), 32 codes each) are transposed once per super-block so
  // that w[i] lane (r, j) holds codes 4i .. 4i + 3 of sub-block j of row r; against the transposed
  // codes of x, V::q4_lane_dot leaves lane (r, j) = sc_j Σ w q over sub-block j, the very integer
  // the reduce forms, so the bits are the same. Per row of x this replaces 8 vpmaddubsw and the
  // ~20-step reduce8_i16 with 8 vpdpbusd and one vpmulld (VNNI), or 8 vpmaddubsw, 7 int16 adds and
  // one vpmaddwd (AVX2); the transpose is paid once per tile, or never where the weight was
  // repacked at load into that order (Q4_K_LANES, Q6_K_LANES: Q8Args::w_lanes).
  SPECDEC_Q8_INLINE void q4_k() const {
    if constexpr (V::kLaneDots) {
      if (a.xt != nullptr) return q4_k_body<true>();
    }
    q4_k_body<false>();
  }

  template <bool kLanes>
  SPECDEC_Q8_INLINE void q4_k_body() const {
    F A[MB];
    SPECDEC_Q8_UNROLL
    for (int m = 0; m < MB; ++m) A[m] = V::zero();
    const int64_t T = a.K / kQK_K;
    const bool in_loop = prefetch_in_loop(R, a.row_bytes);
    for (int64_t t = 0; t < T; ++t) {
      const uint8_t* blk = wrow() + t * sizeof(BlockQ4_K);
      prefetch(in_loop, t * sizeof(BlockQ4_K), sizeof(BlockQ4_K));
      float d[R], dmin[R];
      uint64_t sc[R], mn[R];
      for (int r = 0; r < R; ++r) {
        d[r] = V::h2f(u16(blk, r));
        dmin[r] = V::h2f(u16(blk + 2, r));
        q4k_scales_mins_bytes(blk + r * a.row_bytes + 4, sc[r], mn[r]);
      }
      const F dv = V::rows_f(d), dmv = V::rows_f(dmin);
      I w[8];
      SPECDEC_Q8_UNROLL
      for (int c = 0; c < 4; ++c) {
        const I raw = V::wload(blk + 16 + 32 * c, a.row_bytes);
        w[2 * c] = V::and8(raw, 15);
        w[2 * c + 1] = V::and8(V::srli16(raw, 4), 15);
      }
      I scv;  // the scales: int16 pairs for the reduce, int32 lanes for the lane dots
      if constexpr (kLanes) {
        if (!a.w_lanes) V::transpose8(w);  // Q4_K_LANES blocks split into lane order as loaded
        scv = V::q4_lane_scales(sc);
      } else {
        scv = V::pairs16(sc);
      }
      const I mnv = V::pairs16(mn);
      SPECDEC_Q8_UNROLL
      for (int m = 0; m < MB; ++m) {
        I dot;
        if constexpr (kLanes) {
          dot = V::q4_lane_dot(w, a.codes_t(m0 + m) + 2 * kQK_K * t, scv);
        } else {
          I p[8];
          SPECDEC_Q8_UNROLL
          for (int s = 0; s < 8; ++s) p[s] = V::maddubs(w[s], xcodes(m0 + m, kQK_K * t + 32 * s));
          dot = V::reduce8_i16(p, scv);
        }
        const I mins = V::madd(V::xs16(a.sums(m0 + m) + 16 * t), mnv);  // lane s: m_s * Σ q
        const F dx = V::xf(a.scales(m0 + m) + 8 * t);
        A[m] = V::fma(V::cvt(dot), V::mul(dv, dx), A[m]);
        A[m] = V::fnma(V::cvt(mins), V::mul(dmv, dx), A[m]);
      }
    }
    store(A);
  }

  // ---- Q6_K: 210 bytes: ql[128] @0, qh[64] @128, scales[16] @192, d @208 --------------------
  // Codes w + 32 in 0..63 (maddubs pairs <= 2 * 63 * 127); the 32 comes off through the half
  // sums: lane g -= 32 * (sc_2g s_2g + sc_2g+1 s_2g+1).
  //
  // Lane dots (as Q4_K's): after the transpose registers i < 4 hold codes 0 .. 15 of each
  // sub-block, the rest codes 16 .. 31, so two accumulators take the two scales of a sub-block.
  SPECDEC_Q8_INLINE void q6_k() const {
    if constexpr (V::kLaneDots) {
      if (a.xt != nullptr) return q6_k_body<true>();
    }
    q6_k_body<false>();
  }

  template <bool kLanes>
  SPECDEC_Q8_INLINE void q6_k_body() const {
    F A[MB];
    SPECDEC_Q8_UNROLL
    for (int m = 0; m < MB; ++m) A[m] = V::zero();
    const int64_t T = a.K / kQK_K;
    const bool in_loop = prefetch_in_loop(R, a.row_bytes);
    for (int64_t t = 0; t < T; ++t) {
      const uint8_t* blk = wrow() + t * sizeof(BlockQ6_K);
      prefetch(in_loop, t * sizeof(BlockQ6_K), sizeof(BlockQ6_K));
      float d[R];
      for (int r = 0; r < R; ++r) d[r] = V::h2f(u16(blk + 208, r));
      const F dv = V::rows_f(d);
      I w[8];
      SPECDEC_Q8_UNROLL
      for (int h = 0; h < 2; ++h) {
        // group 4h + i, weight l: low 4 bits ql[64h + 32 (i & 1) + l] >> 4 (i >> 1), high 2 bits
        // qh[32h + l] >> 2i (blocks.h)
        const I ql0 = V::wload(blk + 64 * h, a.row_bytes), ql1 = V::wload(blk + 64 * h + 32, a.row_bytes);
        const I qh = V::wload(blk + 128 + 32 * h, a.row_bytes);
        w[4 * h + 0] = V::or_(V::and8(ql0, 15), V::slli16(V::and8(qh, 0x03), 4));
        w[4 * h + 1] = V::or_(V::and8(ql1, 15), V::slli16(V::and8(qh, 0x0c), 2));
        w[4 * h + 2] = V::or_(V::and8(V::srli16(ql0, 4), 15), V::and8(qh, 0x30));
        w[4 * h + 3] = V::or_(V::and8(V::srli16(ql1, 4), 15), V::srli16(V::and8(qh, 0xc0), 2));
      }
      const I sc16 = V::q6_scales(blk + 192, a.row_bytes);
      // the scales of the groups' first / last 16 values: in the reduce's lane order, or per lane
      I s_first, s_last;
      if constexpr (kLanes) {
        if (!a.w_lanes) V::transpose8(w);  // Q6_K_LANES blocks decode into lane order as loaded
        V::q6_lane_scales(blk + 192, a.row_bytes, s_first, s_last);
      } else {
        V::q6_half_scales(blk + 192, a.row_bytes, s_first, s_last);
      }
      SPECDEC_Q8_UNROLL
      for (int m = 0; m < MB; ++m) {
        I sums;  // lane g: sc_2g Σ_lo16 (w + 32) q + sc_2g+1 Σ_hi16 (w + 32) q
        if constexpr (kLanes) {
          sums = V::q6_lane_sums(w, a.codes_t(m0 + m) + 2 * kQK_K * t, s_first, s_last);
        } else {
          I p[8];
          SPECDEC_Q8_UNROLL
          for (int g = 0; g < 8; ++g) p[g] = V::dot4(w[g], xcodes(m0 + m, kQK_K * t + 32 * g));
          sums = V::reduce8_halves(p, s_first, s_last);
        }
        const I off = V::madd(V::xs16(a.sums(m0 + m) + 16 * t), sc16);
        const I dot = V::sub32(sums, V::slli32(off, 5));
        const F dx = V::xf(a.scales(m0 + m) + 8 * t);
        A[m] = V::fma(V::cvt(dot), V::mul(dv, dx), A[m]);
      }
    }
    store(A);
  }

  // ---- Q8_0 / Q5_0 / Q4_1: one octet = blocks 8t .. 8t + cnt - 1 -----------------------------
  // Q8_0: |w| x ±q, pairs <= 2 * 128 * 127; Q5_0: w in 0..31 (16 off through the sums); Q4_1: 0..15.
  //
  // Lane dots (kLanes: the VNNI tier's two-row tiles with x's codes transposed per call,
  // Q8Args::xt): the 8 blocks' registers are transposed once per tile, so w[i] lane (r, j)
  // holds codes 4i .. 4i + 3 of block j of row r, and 8 vpdpbusd per row of x leave lane (r, j) =
  // Σ w q over block j: the integer the reduce forms, so the bits are the same. Per row of x this
  // replaces the ~20-step reduce (Q4_1: the int16 one and its vpmaddwd); the transpose (24 steps)
  // is paid once per tile, so it pays from two rows of x on (a verification, a prompt). Q8_0's
  // signed codes go in as w + 128 (flip8) and 128 Σ q comes off: Σ w q again, with no sign step.
  static constexpr bool kLegacyLanes = V::kLaneDots && R == 2;

  template <int kType>
  SPECDEC_Q8_INLINE void octet(int64_t t, int cnt, bool in_loop, F* A) const {
    if constexpr (kLegacyLanes) {
      if (a.xt != nullptr) return octet_body<kType, true>(t, cnt, in_loop, A);
    }
    octet_body<kType, false>(t, cnt, in_loop, A);
  }

  template <int kType, bool kLanes>
  SPECDEC_Q8_INLINE void octet_body(int64_t t, int cnt, bool in_loop, F* A) const {
    constexpr int64_t kBytes = kType == 8 ? sizeof(BlockQ8_0) : kType == 6 ? sizeof(BlockQ5_0) : sizeof(BlockQ4_1);
    const uint8_t* blk = wrow() + 8 * t * kBytes;
    prefetch(in_loop, 8 * t * kBytes, 8 * kBytes);
    I w[8];
    SPECDEC_Q8_UNROLL
    for (int j = 0; j < 8; ++j) {
      w[j] = V::izero();
      if (j >= cnt) continue;
      const uint8_t* b = blk + j * kBytes;
      if constexpr (kType == 8) w[j] = V::wload(b + 2, a.row_bytes);  // signs; |w| below
      if constexpr (kType == 6) w[j] = V::or_(V::wnib16(b + 6, a.row_bytes), V::wbit5(b + 2, a.row_bytes));
      if constexpr (kType == 3) w[j] = V::wnib16(b + 4, a.row_bytes);
    }
    I wabs[8];
    if constexpr (kType == 8 && kLanes) {
      SPECDEC_Q8_UNROLL
      for (int j = 0; j < cnt; ++j) w[j] = V::flip8(w[j]);  // blocks past cnt stay zero
    } else if constexpr (kType == 8) {
      SPECDEC_Q8_UNROLL
      for (int j = 0; j < 8; ++j) wabs[j] = V::abs8(w[j]);
    }
    const F dw = V::halves8(blk, kBytes, a.row_bytes, cnt);
    F mw = V::zero();
    if constexpr (kType == 3) mw = V::halves8(blk + 2, kBytes, a.row_bytes, cnt);
    const I ones = V::ones16();
    if constexpr (kLanes) V::transpose8(w);  // blocks past cnt are zero registers: zero lanes
    SPECDEC_Q8_UNROLL
    for (int m = 0; m < MB; ++m) {
      I dot;
      if constexpr (kLanes) {
        dot = V::legacy_lane_dot(w, a.codes_t(m0 + m) + 2 * kQK_K * t);
      } else {
        I p[8];
        SPECDEC_Q8_UNROLL
        for (int j = 0; j < 8; ++j) {
          if (j >= cnt) {
            p[j] = V::izero();
            continue;
          }
          const I x = xcodes(m0 + m, 256 * t + 32 * j);
          if constexpr (kType == 8) {
            p[j] = V::dot4(wabs[j], V::sign8(x, w[j]));
          } else if constexpr (kType == 6) {
            p[j] = V::dot4(w[j], x);
          } else {
            p[j] = V::maddubs(w[j], x);  // 4-bit codes: reduced in int16
          }
        }
        dot = kType == 3 ? V::reduce8_i16(p, ones) : V::reduce8(p);
      }
      const F dx = V::xf(a.scales(m0 + m) + 8 * t);
      if constexpr (kType == 8) {
        if constexpr (kLanes) dot = V::sub32(dot, V::slli32(V::madd(V::xs16(a.sums(m0 + m) + 16 * t), ones), 7));
        A[m] = V::fma(V::cvt(dot), V::mul(dw, dx), A[m]);
      } else {
        const I qsum = V::madd(V::xs16(a.sums(m0 + m) + 16 * t), ones);  // lane j: Σ q of block 8t + j
        if constexpr (kType == 6) {
          dot = V::sub32(dot, V::slli32(qsum, 4));
          A[m] = V::fma(V::cvt(dot), V::mul(dw, dx), A[m]);
        } else {
          A[m] = V::fma(V::cvt(dot), V::mul(dw, dx), A[m]);
          A[m] = V::fma(V::cvt(qsum), V::mul(mw, dx), A[m]);
        }
      }
    }
  }

  template <int kType>
  SPECDEC_Q8_INLINE void legacy() const {
    F A[MB];
    SPECDEC_Q8_UNROLL
    for (int m = 0; m < MB; ++m) A[m] = V::zero();
    const int64_t G = a.K / kQK, full = G / 8;
    const bool in_loop = prefetch_in_loop(R, a.row_bytes);
    for (int64_t t = 0; t < full; ++t) octet<kType>(t, 8, in_loop, A);
    if (G % 8) octet<kType>(full, static_cast<int>(G % 8), in_loop, A);
    store(A);
  }
};

// Rows [n_begin, n_end) of y (n_end - n_begin a multiple of V::kRows), all M rows of x, in tiles
// of up to kMaxMB rows of x (tile_rows.h).
template <class V, int kMaxMB>
void q8_rows(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  static_assert(kMaxMB >= 1 && kMaxMB <= 8, "tiles of 1 to 8 rows of x are instantiated");
  tile_rows<Q8Tile, V, kMaxMB>(type, a, M, n_begin, n_end);
}
