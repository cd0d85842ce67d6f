// The AVX-512 VNNI tier of the Q8K matmul (q8k.h): 16 rows of W in the vector lanes.
//
// Per call (a thread's rows [n_begin, n_end) of W, all M rows of x), for each group of 16 rows:
//   1. every super-block of the group is decoded once into a panel (q8k_decode.h: codes as 64
//      steps of [16 rows][4 codes], the sub-block scales and the sums' coefficients as int32
//      lanes, d and dmin as float lanes);
//   2. for each tile of MB <= 4 rows of x and each super-block t, per sub-block j: vpdpbusd of the
//      panel's step (u8 codes of 16 rows) with 4 codes of x broadcast, acc[i] lane r = Σ w q over
//      the sub-block; S[i] += acc[i] * sc_j (vpmulld); the sums' term P[i] by vpdpwssd of the
//      coefficient pairs with x's pairs of 16-value sums; then the float steps of q8k.h, lane r
//      being output n0 + r: the same integers and the same float operations in the same order as
//      the portable tier, so the same bits.
// Decoding costs a pass over the group's blocks per call, the products 64 vpdpbusd per super-block
// and row of x for 16 outputs.
#include "kernels/gguf/q8k.h"

#if defined(__x86_64__)
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gguf/blocks.h"
#include "kernels/gguf/q8k_decode.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace specdec::gguf {
namespace {

inline __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Rows m0 .. m0 + MB - 1 of x against the group's panels (T of them): y's 16 lanes, `rows` valid.
template <int MB, int kSubs>
void tile(const Q8kPanel* panels, int64_t T, bool q4, const uint8_t* xk, int64_t xb, int64_t K, int64_t m0, float* y,
          int64_t ldy, int64_t n0, int rows) {
  constexpr int kSteps = 64 / kSubs;  // steps of 4 codes per sub-block
  const int8_t* q[MB];
  const float* dx[MB];
  const int16_t* s[MB];
  for (int i = 0; i < MB; ++i) {
    const uint8_t* row = xk + (m0 + i) * xb;
    q[i] = reinterpret_cast<const int8_t*>(row);
    dx[i] = reinterpret_cast<const float*>(row + K);
    s[i] = reinterpret_cast<const int16_t*>(row + K + 4 * T);
  }
  __m512 A[MB];
  for (int i = 0; i < MB; ++i) A[i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < T; ++t) {
    const Q8kPanel& p = panels[t];
    __m512i S[MB], P[MB];
    for (int i = 0; i < MB; ++i) S[i] = P[i] = _mm512_setzero_si512();
    for (int j = 0; j < kSubs; ++j) {
      __m512i acc[MB];
      for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int st = 0; st < kSteps; ++st) {
        const int step = j * kSteps + st;
        const __m512i w = _mm512_load_si512(p.w + step * 64);
        for (int i = 0; i < MB; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], w, bcast32(q[i] + 256 * t + 4 * step));
      }
      const __m512i sc = _mm512_load_si512(p.sc + j * 16);
      for (int i = 0; i < MB; ++i) S[i] = _mm512_add_epi32(S[i], _mm512_mullo_epi32(acc[i], sc));
    }
#pragma GCC unroll 8
    for (int h = 0; h < 8; ++h) {
      const __m512i pc = _mm512_load_si512(p.pc + h * 16);
      for (int i = 0; i < MB; ++i) P[i] = _mm512_dpwssd_epi32(P[i], pc, bcast32(s[i] + 16 * t + 2 * h));
    }
    const __m512 d = _mm512_load_ps(p.d);
    if (q4) {
      const __m512 dmin = _mm512_load_ps(p.dmin);
      for (int i = 0; i < MB; ++i) {
        const __m512 x = _mm512_set1_ps(dx[i][t]);
        A[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[i]), _mm512_mul_ps(d, x), A[i]);
        A[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(P[i]), _mm512_mul_ps(dmin, x), A[i]);
      }
    } else {
      for (int i = 0; i < MB; ++i) {
        const __m512i s6 = _mm512_sub_epi32(S[i], _mm512_slli_epi32(P[i], 5));
        A[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s6), _mm512_mul_ps(d, _mm512_set1_ps(dx[i][t])), A[i]);
      }
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1u);
  for (int i = 0; i < MB; ++i) _mm512_mask_storeu_ps(y + (m0 + i) * ldy + n0, mask, A[i]);
}

template <int kSubs>
void tiles(const Q8kPanel* panels, int64_t T, bool q4, const uint8_t* xk, int64_t xb, int64_t M, int64_t K, float* y,
           int64_t ldy, int64_t n0, int rows) {
  int64_t m0 = 0;
  for (; m0 + 4 <= M; m0 += 4) tile<4, kSubs>(panels, T, q4, xk, xb, K, m0, y, ldy, n0, rows);
  switch (M - m0) {
    case 3: tile<3, kSubs>(panels, T, q4, xk, xb, K, m0, y, ldy, n0, rows); break;
    case 2: tile<2, kSubs>(panels, T, q4, xk, xb, K, m0, y, ldy, n0, rows); break;
    case 1: tile<1, kSubs>(panels, T, q4, xk, xb, K, m0, y, ldy, n0, rows); break;
    default: break;
  }
}

// The panels of super-block t of rows n0 .. n0 + rows - 1 of a lane-order weight, the codes by
// gathers (one dword of 4 codes per row and lane; the lane order puts each step's 4 codes in one
// dword of a row), the scales and d by q8k_decode_scales. Rows past `rows` are zero.
void panel_lanes(int32_t type, const uint8_t* weight, int64_t rb, int64_t n0, int rows, int64_t t, Q8kPanel& p) {
  const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1u);
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(static_cast<int32_t>(rb)));
  const uint8_t* base = weight + n0 * rb + t * block_bytes(type);
  const __m512i nib = _mm512_set1_epi32(0x0f0f0f0f);
  auto gather = [&](int64_t off) {  // the dword at byte `off` of each row's block
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, idx, base + off, 1);
  };
  auto put = [&](int step, __m512i v) { _mm512_store_si512(p.w + step * 64, v); };
  if (type == kQ4_K_Lanes) {
    // qs[32c + 4j + b]: code 8c + b of sub-block j (low nibble), 8c + 4 + b (high): steps 8j + 2c, + 1
    for (int c = 0; c < 4; ++c)
      for (int j = 0; j < 8; ++j) {
        const __m512i v = gather(16 + 32 * c + 4 * j);
        put(8 * j + 2 * c, _mm512_and_si512(v, nib));
        put(8 * j + 2 * c + 1, _mm512_and_si512(_mm512_srli_epi32(v, 4), nib));
      }
  } else {
    // step 8g + 4h + i (group g, codes 16h + 4i ..): ql dword at 64h + 32 (i & 1) + 4g, nibble
    // i >> 1; qh dword at 128 + 32h + 4g, bits 2i (q8k_decode.h's q6k_lanes_code, 4 codes at once)
    const __m512i three = _mm512_set1_epi32(0x03030303);
    for (int h = 0; h < 2; ++h)
      for (int g = 0; g < 8; ++g) {
        const __m512i qh = gather(128 + 32 * h + 4 * g);
        for (int half = 0; half < 2; ++half) {
          const __m512i ql = gather(64 * h + 32 * half + 4 * g);
          for (int hi = 0; hi < 2; ++hi) {
            const int i = 2 * hi + half;
            const __m512i low = _mm512_and_si512(_mm512_srli_epi32(ql, 4 * hi), nib);
            const __m512i high = _mm512_and_si512(_mm512_srli_epi32(qh, 2 * i), three);
            put(8 * g + 4 * h + i, _mm512_or_si512(low, _mm512_slli_epi32(high, 4)));
          }
        }
      }
  }
  Q8kSuperblock sb;  // its scales only: the codes went to the panel above
  for (int r = 0; r < 16; ++r) {
    if (r < rows) q8k_decode_scales(type, base + r * rb, 0, sb);
    q8k_panel_scales(r < rows ? &sb : nullptr, r, p);
  }
}

}  // namespace

void matmul_q8k_rows_avx512_vnni(int32_t type, const uint8_t* xk, int64_t M, int64_t K, const uint8_t* weight,
                                 float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  const int64_t T = K / kQK_K, rb = T * block_bytes(type), xb = q8k_row_bytes(K);
  const bool q4 = file_type(type) == 12;
  static thread_local std::vector<Q8kPanel> panels;
  panels.resize(static_cast<size_t>(T));
  Q8kSuperblock sb;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += 16) {
    const int rows = static_cast<int>(n_end - n0 < 16 ? n_end - n0 : 16);
    for (int64_t t = 0; t < T; ++t) {
      if (is_lanes(type)) {  // the loaders' layout where this tier runs (VNNI without AMX)
        panel_lanes(type, weight, rb, n0, rows, t, panels[t]);
        continue;
      }
      for (int r = 0; r < 16; ++r) {  // the file's order: scalar, a pass per code
        if (r < rows) q8k_decode(type, weight + (n0 + r) * rb, t, sb);
        q8k_panel_row(r < rows ? &sb : nullptr, r, panels[t]);
      }
    }
    if (q4) {
      tiles<8>(panels.data(), T, true, xk, xb, M, K, y, ldy, n0, rows);
    } else {
      tiles<16>(panels.data(), T, false, xk, xb, M, K, y, ldy, n0, rows);
    }
  }
}

}  // namespace specdec::gguf
#pragma GCC pop_options

#else
#include <cstdlib>
namespace specdec::gguf {
void matmul_q8k_rows_avx512_vnni(int32_t, const uint8_t*, int64_t, int64_t, const uint8_t*, float*, int64_t, int64_t,
                                 int64_t) {
  std::abort();  // q8k_cpu.cpp runs this tier only where the CPU has it
}
}  // namespace specdec::gguf
#endif
