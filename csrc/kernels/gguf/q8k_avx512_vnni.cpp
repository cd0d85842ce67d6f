// The AVX-512 VNNI tier of the Q8K matmul (q8k.h): 16 rows of W in the vector lanes.
//
// Per call (a thread's rows [n_begin, n_end) of W, all M rows of x), for each group of 16 rows:
//   1. the codes, as 64 steps of [16 rows][4 codes] per super-block: read straight from a panel
//      layout (panels.h: a step is one load and a nibble split), or else gathered once per call
//      into a panel (q8k_decode.h) from rows stored one after another; the sub-block scales and
//      the sums' coefficients as int32 lanes, d and dmin as float lanes (Q8kScales), decoded once
//      per call and group;
//   2. for each tile of MB <= 4 rows of x and each super-block t, per sub-block j: vpdpbusd of the
//      steps (u8 codes of 16 rows) with 4 codes of x broadcast, acc[i] lane r = Σ w q over the
//      sub-block; S[i] += acc[i] * sc_j (vpmulld); the sums' term P[i] by vpdpwssd of the
//      coefficient pairs with x's pairs of 16-value sums; then the float steps of q8k.h, lane r
//      being output n0 + r: the same integers and the same float operations in the same order as
//      the portable tier, so the same bits.
// The products are 64 vpdpbusd per super-block and row of x for 16 outputs. Gathering a panel costs
// a pass over the group's blocks per call (~26 ns per super-block and row of W on a Zen 4 core,
// more than the products at one or five rows of x); panels cost a nibble split per step.
#include "kernels/gguf/q8k.h"

#if defined(__x86_64__)
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gguf/blocks.h"
#include "kernels/gguf/panels.h"
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

// The scales of super-block t of a panel group (panels.h's layout), decoded into lanes.
void panel_scales(int32_t type, const uint8_t* group, int64_t t, Q8kScales& out) {
  const __m512i byte = _mm512_set1_epi32(0xff), low16 = _mm512_set1_epi32(0xffff);
  if (file_type(type) == 12) {
    const uint8_t* base = group + t * 2304 + 2048;
    const __m512i d0 = _mm512_loadu_si512(base), d1 = _mm512_loadu_si512(base + 64);
    const __m512i d2 = _mm512_loadu_si512(base + 128), dd = _mm512_loadu_si512(base + 192);
    const __m512i six = _mm512_set1_epi32(0x3f3f3f3f), four = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i top = _mm512_set1_epi32(0x30303030);
    // bytes j of (sc_lo, sc_hi, m_lo, m_hi) = sc_j, sc_4+j, m_j, m_4+j (blocks.h's packing)
    const __m512i sc_lo = _mm512_and_si512(d0, six), m_lo = _mm512_and_si512(d1, six);
    const __m512i sc_hi = _mm512_or_si512(_mm512_and_si512(d2, four), _mm512_and_si512(_mm512_srli_epi32(d0, 2), top));
    const __m512i m_hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(d2, 4), four),
                                         _mm512_and_si512(_mm512_srli_epi32(d1, 2), top));
    for (int j = 0; j < 4; ++j) {
      const int sh = 8 * j;
      const __m512i m0 = _mm512_and_si512(_mm512_srli_epi32(m_lo, sh), byte);
      const __m512i m1 = _mm512_and_si512(_mm512_srli_epi32(m_hi, sh), byte);
      _mm512_store_si512(out.sc + 16 * j, _mm512_and_si512(_mm512_srli_epi32(sc_lo, sh), byte));
      _mm512_store_si512(out.sc + 16 * (j + 4), _mm512_and_si512(_mm512_srli_epi32(sc_hi, sh), byte));
      _mm512_store_si512(out.pc + 16 * j, _mm512_or_si512(m0, _mm512_slli_epi32(m0, 16)));
      _mm512_store_si512(out.pc + 16 * (j + 4), _mm512_or_si512(m1, _mm512_slli_epi32(m1, 16)));
    }
    _mm512_store_ps(out.d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd)));
    _mm512_store_ps(out.dmin, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dd, 16))));
    return;
  }
  const uint8_t* base = group + t * 3360 + 3072;
  for (int c = 0; c < 4; ++c) {
    const __m512i e = _mm512_loadu_si512(base + 64 * c);
    __m512i sc[4];
    for (int b = 0; b < 4; ++b) {  // int8 scales[4c + b], sign-extended
      sc[b] = _mm512_srai_epi32(_mm512_slli_epi32(e, 24 - 8 * b), 24);
      _mm512_store_si512(out.sc + 16 * (4 * c + b), sc[b]);
    }
    for (int h = 0; h < 2; ++h)  // pair 2c + h: (scales[4c + 2h], scales[4c + 2h + 1]) as int16
      _mm512_store_si512(out.pc + 16 * (2 * c + h),
                         _mm512_or_si512(_mm512_and_si512(sc[2 * h], low16), _mm512_slli_epi32(sc[2 * h + 1], 16)));
  }
  _mm512_store_ps(out.d, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + 256))));
  _mm512_store_ps(out.dmin, _mm512_setzero_ps());
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

// Where a tile reads a group's codes and scales: begin(t) once before super-block t's tiles (panels:
// decodes its scales), ahead(t, j, first) in sub-block j of the first tile (panels: prefetches the
// stream), fill(t, j, w) puts the kSteps steps of sub-block j in w, scales(t) is the super-block's
// Q8kScales.
struct GatheredCodes {  // panels gathered per call (Q8kPanel)
  const Q8kPanel* panels;
  void begin(int64_t) const {}
  template <int kSubs>
  void ahead(int64_t, int, bool) const {}
  template <int kSteps>
  void fill(int64_t t, int j, __m512i* w) const {
    for (int st = 0; st < kSteps; ++st) w[st] = _mm512_load_si512(panels[t].w + 64 * (j * kSteps + st));
  }
  const Q8kScales& scales(int64_t t) const { return panels[t].s; }
};

// Panels 4 ahead (9 / 13 KB) of the one being multiplied, into L2. Without it a panel's lines
// were requested only when its steps were loaded, memory waits and products in series: the 1.5B's
// 5-row verification took 93 ms against the Q8 kernel's 67; with it 45 (2 or 8 panels ahead, or
// into L1, measured 47-50; a Zen 4 EPYC, 2 threads, medians of 7). An asm statement: GCC dropped
// the builtin prefetches of this loop.
constexpr int64_t kPanelsAhead = 4;

// A panel group (panels.h): each super-block's scales decoded once into `decoded`, the stream
// prefetched by the group's first tile of rows of x.
struct PanelStream {
  int32_t type;
  const uint8_t* group;
  Q8kScales* decoded;
  int64_t panel_bytes;
  void begin(int64_t t) const { panel_scales(type, group, t, decoded[t]); }
  // Part j of kSubs of the panel kPanelsAhead ahead: a few lines per sub-block rather than a
  // burst (more misses in flight than the core tracks stall it).
  template <int kSubs>
  void ahead(int64_t t, int j, bool first) const {
    if (!first) return;
    const int64_t lines = (panel_bytes + 63) / 64, per = (lines + kSubs - 1) / kSubs;
    const char* base = reinterpret_cast<const char*>(group + (t + kPanelsAhead) * panel_bytes);
    for (int64_t l = j * per; l < std::min(lines, (j + 1) * per); ++l)
      asm volatile("prefetcht1 %0" : : "m"(base[64 * l]));
  }
  const Q8kScales& scales(int64_t t) const { return decoded[t]; }
};

struct Q4kPanelCodes : PanelStream {  // a Q4_K_PANELS group: step 8j + st is nibble st & 1 of pair 4j + st / 2
  template <int kSteps>
  void fill(int64_t t, int j, __m512i* w) const {
    const uint8_t* base = group + t * 2304 + 256 * j;
    const __m512i nib = _mm512_set1_epi32(0x0f0f0f0f);
    for (int p = 0; p < 4; ++p) {
      const __m512i v = _mm512_loadu_si512(base + 64 * p);
      w[2 * p] = _mm512_and_si512(v, nib);
      w[2 * p + 1] = _mm512_and_si512(_mm512_srli_epi32(v, 4), nib);
    }
  }
};

// A Q6_K_PANELS group: step 4j + st is nibble st & 1 of pair 2j + st / 2, bits 2 st of quad j.
struct Q6kPanelCodes : PanelStream {
  template <int kSteps>
  void fill(int64_t t, int j, __m512i* w) const {
    const uint8_t* base = group + t * 3360;
    const __m512i nib = _mm512_set1_epi32(0x0f0f0f0f), two = _mm512_set1_epi32(0x30303030);
    const __m512i lo0 = _mm512_loadu_si512(base + 128 * j), lo1 = _mm512_loadu_si512(base + 128 * j + 64);
    const __m512i hi = _mm512_loadu_si512(base + 2048 + 64 * j);
    auto low = [&](__m512i v, int shift) { return _mm512_and_si512(_mm512_srli_epi32(v, shift), nib); };
    w[0] = _mm512_or_si512(low(lo0, 0), _mm512_and_si512(_mm512_slli_epi32(hi, 4), two));
    w[1] = _mm512_or_si512(low(lo0, 4), _mm512_and_si512(_mm512_slli_epi32(hi, 2), two));
    w[2] = _mm512_or_si512(low(lo1, 0), _mm512_and_si512(hi, two));
    w[3] = _mm512_or_si512(low(lo1, 4), _mm512_and_si512(_mm512_srli_epi32(hi, 2), two));
  }
};

// Super-block t of one group of 16 rows of W (codes from src) against rows m0 .. m0 + MB - 1 of x:
// the float steps go to acc (row m's 16 lanes at acc + 16 m, lane r: output n0 + r).
template <int MB, int kSubs, class Codes>
void tile(const Codes& src, int64_t t, bool first, int64_t T, bool q4, const uint8_t* xk, int64_t xb, int64_t K,
          int64_t m0, float* acc_rows) {
  constexpr int kSteps = 64 / kSubs;  // steps of 4 codes per sub-block
  const int8_t* q[MB];
  const int16_t* s[MB];
  float dx[MB];
  for (int i = 0; i < MB; ++i) {
    const uint8_t* row = xk + (m0 + i) * xb;
    q[i] = reinterpret_cast<const int8_t*>(row) + 256 * t;
    dx[i] = reinterpret_cast<const float*>(row + K)[t];
    s[i] = reinterpret_cast<const int16_t*>(row + K + 4 * T) + 16 * t;
  }
  const Q8kScales& p = src.scales(t);
  __m512i S[MB], P[MB];
  for (int i = 0; i < MB; ++i) S[i] = P[i] = _mm512_setzero_si512();
  for (int j = 0; j < kSubs; ++j) {
    __m512i w[kSteps], acc[MB];
    src.template ahead<kSubs>(t, j, first);
    src.template fill<kSteps>(t, j, w);
    for (int i = 0; i < MB; ++i) acc[i] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int st = 0; st < kSteps; ++st) {
      const int step = j * kSteps + st;
      for (int i = 0; i < MB; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], w[st], bcast32(q[i] + 4 * step));
    }
    const __m512i sc = _mm512_load_si512(p.sc + j * 16);
    for (int i = 0; i < MB; ++i) S[i] = _mm512_add_epi32(S[i], _mm512_mullo_epi32(acc[i], sc));
  }
#pragma GCC unroll 8
  for (int h = 0; h < 8; ++h) {
    const __m512i pc = _mm512_load_si512(p.pc + h * 16);
    for (int i = 0; i < MB; ++i) P[i] = _mm512_dpwssd_epi32(P[i], pc, bcast32(s[i] + 2 * h));
  }
  const __m512 d = _mm512_load_ps(p.d);
  const __m512 dmin = _mm512_load_ps(p.dmin);
  for (int i = 0; i < MB; ++i) {
    float* a = acc_rows + 16 * (m0 + i);
    const __m512 x = _mm512_set1_ps(dx[i]);
    __m512 A = _mm512_load_ps(a);
    if (q4) {
      A = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S[i]), _mm512_mul_ps(d, x), A);
      A = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(P[i]), _mm512_mul_ps(dmin, x), A);
    } else {
      const __m512i s6 = _mm512_sub_epi32(S[i], _mm512_slli_epi32(P[i], 5));
      A = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s6), _mm512_mul_ps(d, x), A);
    }
    _mm512_store_ps(a, A);
  }
}

// All M rows of x against one group of 16 rows of W, super-block by super-block (each panel read
// from memory once, while every row of x multiplies it: the products overlap the stream), tiles of
// up to 4 rows, or 5 where 5 remain (a chain verification of k = 4: one tile of 5 instead of 4 + 1
// unpacks each panel's codes once; the 1.5B's 5- and 9-row steps 6% faster on a Sapphire Rapids
// -class Xeon, three alternating processes): y's lanes in `mask` (lane r: output n0 + r).
template <int kSubs, class Codes>
void tiles(const Codes& src, int64_t T, bool q4, const uint8_t* xk, int64_t xb, int64_t M, int64_t K, float* y,
           int64_t ldy, int64_t n0, __mmask16 mask) {
  struct alignas(64) Lanes {
    float v[16];
  };
  static thread_local std::vector<Lanes> acc_rows;  // one zmm per row of x (over-aligned: C++17 new)
  acc_rows.assign(static_cast<size_t>(M), Lanes{});
  float* acc = acc_rows.data()->v;
  for (int64_t t = 0; t < T; ++t) {
    src.begin(t);
    int64_t m0 = 0;
    for (; m0 + 4 <= M && M - m0 != 5; m0 += 4) tile<4, kSubs>(src, t, m0 == 0, T, q4, xk, xb, K, m0, acc);
    switch (M - m0) {
      case 5: tile<5, kSubs>(src, t, m0 == 0, T, q4, xk, xb, K, m0, acc); break;
      case 3: tile<3, kSubs>(src, t, m0 == 0, T, q4, xk, xb, K, m0, acc); break;
      case 2: tile<2, kSubs>(src, t, m0 == 0, T, q4, xk, xb, K, m0, acc); break;
      case 1: tile<1, kSubs>(src, t, m0 == 0, T, q4, xk, xb, K, m0, acc); break;
      default: break;
    }
  }
  for (int64_t m = 0; m < M; ++m) _mm512_mask_storeu_ps(y + m * ldy + n0, mask, _mm512_load_ps(acc + 16 * m));
}

}  // namespace

void matmul_q8k_rows_avx512_vnni(int32_t type, const uint8_t* xk, int64_t M, int64_t K, const uint8_t* weight,
                                 float* y, int64_t ldy, int64_t n_begin, int64_t n_end) {
  const int64_t T = K / kQK_K, rb = T * block_bytes(type), xb = q8k_row_bytes(K);
  const bool q4 = file_type(type) == 12;
  if (is_panels(type)) {
    static thread_local std::vector<Q8kScales> decoded;
    decoded.resize(static_cast<size_t>(T));
    for (int64_t g0 = n_begin / kPanelRows * kPanelRows; g0 < n_end; g0 += kPanelRows) {
      const PanelStream stream{type, weight + g0 * rb, decoded.data(), kPanelRows * block_bytes(type)};
      const int64_t a = std::max(n_begin, g0) - g0, b = std::min(n_end, g0 + kPanelRows) - g0;
      const __mmask16 mask = static_cast<__mmask16>(((1u << b) - 1u) & ~((1u << a) - 1u));
      if (q4) {
        tiles<8>(Q4kPanelCodes{stream}, T, true, xk, xb, M, K, y, ldy, g0, mask);
      } else {
        tiles<16>(Q6kPanelCodes{stream}, T, false, xk, xb, M, K, y, ldy, g0, mask);
      }
    }
    return;
  }
  static thread_local std::vector<Q8kPanel> panels;
  panels.resize(static_cast<size_t>(T));
  Q8kSuperblock sb;
  for (int64_t n0 = n_begin; n0 < n_end; n0 += 16) {
    const int rows = static_cast<int>(n_end - n0 < 16 ? n_end - n0 : 16);
    for (int64_t t = 0; t < T; ++t) {
      if (is_lanes(type)) {  // the lane order: each step one gather
        panel_lanes(type, weight, rb, n0, rows, t, panels[t]);
        continue;
      }
      for (int r = 0; r < 16; ++r) {  // the file's order: scalar, a pass per code
        if (r < rows) q8k_decode(type, weight + (n0 + r) * rb, t, sb);
        q8k_panel_row(r < rows ? &sb : nullptr, r, panels[t]);
      }
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1u);
    if (q4) {
      tiles<8>(GatheredCodes{panels.data()}, T, true, xk, xb, M, K, y, ldy, n0, mask);
    } else {
      tiles<16>(GatheredCodes{panels.data()}, T, false, xk, xb, M, K, y, ldy, n0, mask);
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
