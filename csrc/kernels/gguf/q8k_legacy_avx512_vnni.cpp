// The AVX-512 VNNI tier of the legacy formats' Q8K matmul (q8k.h, "The legacy formats"): 16 rows
// of W in the vector lanes, as q8k_avx512_vnni.cpp does for the k-quants.
//
// Per call (a thread's rows [n_begin, n_end) of W, all M rows of x), for each group of 16 rows:
//   1. each block column g of the 16 rows is gathered once into a panel: the codes as 8 steps of
//      [16 rows][4 codes] unsigned (Q8_0 w + 128, Q5_0 its 5-bit code w + 16, Q4_1 its nibble),
//      d (and Q4_1's m) as float lanes;
//   2. for each tile of MB <= 4 rows of x and each block g: acc[i] starts at -c Σq (c = 128, 16,
//      0: what the unsigned codes add) and takes 8 vpdpbusd of the steps with 4 codes of x
//      broadcast, so lane r holds the integer of q8k.h's order for output n0 + r; then the float
//      steps, the same operations in the same order as the portable tier, so the same bits.
// The products are 8 vpdpbusd per block and row of x for 16 outputs, the float steps 3 (Q4_1 5).
#include "kernels/gguf/q8k.h"

#if defined(__x86_64__)
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gguf/blocks.h"
#include "kernels/gguf/q8_tiers.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace specdec::gguf {
namespace {

// Block column g of 16 rows of W: codes [8 steps][16 rows][4] (u8), d and m [16 rows].
struct alignas(64) LegacyPanel {
  uint8_t w[8 * 64];
  float d[16], m[16];
};

inline __m512i bcast32(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// What Σ u q over a block exceeds Σ w q by, per unit of Σ q (u the panel's unsigned code).
constexpr int32_t code_offset(int32_t type) { return type == 8 ? 128 : type == 6 ? 16 : 0; }

// Rows m0 .. m0 + MB - 1 of x against the panels of one group of 16 rows (G of them): y's 16
// lanes, `rows` valid.
template <int MB, int32_t kType>
void tile(const LegacyPanel* panels, int64_t G, const Q8Args& a, int64_t m0, int64_t n0, int rows) {
  const int8_t* q[MB];
  const float* dx[MB];
  const int16_t* s[MB];
  for (int i = 0; i < MB; ++i) {
    q[i] = a.codes(m0 + i);
    dx[i] = a.scales(m0 + i);
    s[i] = a.sums(m0 + i);
  }
  __m512 A[MB];
  for (int i = 0; i < MB; ++i) A[i] = _mm512_setzero_ps();
  for (int64_t g = 0; g < G; ++g) {
    const LegacyPanel& p = panels[g];
    int32_t qsum[MB];
    __m512i acc[MB];
    for (int i = 0; i < MB; ++i) {
      qsum[i] = static_cast<int32_t>(s[i][2 * g]) + s[i][2 * g + 1];
      acc[i] = _mm512_set1_epi32(-code_offset(kType) * qsum[i]);
    }
#pragma GCC unroll 8
    for (int st = 0; st < 8; ++st) {
      const __m512i w = _mm512_load_si512(p.w + st * 64);
      for (int i = 0; i < MB; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], w, bcast32(q[i] + 32 * g + 4 * st));
    }
    const __m512 d = _mm512_load_ps(p.d);
    for (int i = 0; i < MB; ++i) {
      const __m512 x = _mm512_set1_ps(dx[i][g]);
      A[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[i]), _mm512_mul_ps(d, x), A[i]);
      if constexpr (kType == 3) {
        const __m512 mx = _mm512_mul_ps(_mm512_load_ps(p.m), x);
        A[i] = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(qsum[i])), mx, A[i]);
      }
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << rows) - 1u);
  for (int i = 0; i < MB; ++i) _mm512_mask_storeu_ps(a.y + (m0 + i) * a.ldy + n0, mask, A[i]);
}

template <int32_t kType>
void tiles(const LegacyPanel* panels, int64_t G, const Q8Args& a, int64_t M, int64_t n0, int rows) {
  int64_t m0 = 0;
  for (; m0 + 4 <= M; m0 += 4) tile<4, kType>(panels, G, a, m0, n0, rows);
  switch (M - m0) {
    case 3: tile<3, kType>(panels, G, a, m0, n0, rows); break;
    case 2: tile<2, kType>(panels, G, a, m0, n0, rows); break;
    case 1: tile<1, kType>(panels, G, a, m0, n0, rows); break;
    default: break;
  }
}

// The panel of block column g of rows n0 .. n0 + rows - 1 (rows past `rows`: d = m = 0), each
// step's dword of 4 codes gathered from the 16 rows' blocks.
void panel(int32_t type, const Q8Args& a, int64_t n0, int rows, int64_t g, LegacyPanel& p) {
  const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1u);
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(static_cast<int32_t>(a.row_bytes)));
  const uint8_t* base = a.weight + n0 * a.row_bytes + g * block_bytes(type);
  auto gather = [&](int64_t off) {  // the dword at byte `off` of each row's block
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, idx, base + off, 1);
  };
  auto put = [&](int step, __m512i v) { _mm512_store_si512(p.w + step * 64, v); };
  const __m512i head = gather(0);  // d (and Q4_1's m) in fp16
  _mm512_store_ps(p.d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)));
  _mm512_store_ps(p.m, type == 3 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)))
                                 : _mm512_setzero_ps());
  const __m512i nib = _mm512_set1_epi32(0x0f0f0f0f);
  if (type == 8) {  // qs at byte 2: w + 128 is the byte with its top bit flipped
    for (int st = 0; st < 8; ++st) put(st, _mm512_xor_si512(gather(2 + 4 * st), _mm512_set1_epi32(static_cast<int32_t>(0x80808080u))));
    return;
  }
  // Q4_1: qs at byte 4; Q5_0: qh (bit k: weight k's fifth bit) at 2, qs at 6. Weight k < 16 is
  // the low nibble of qs[k], k >= 16 the high nibble of qs[k - 16].
  const int64_t qs = type == 3 ? 4 : 6;
  const __m512i qh = type == 6 ? gather(2) : _mm512_setzero_si512();
  const __m512i one = _mm512_set1_epi32(1);
  // Bits 0..3 of t to bit 4 of bytes 0..3.
  auto spread = [&](__m512i t) {
    __m512i out = _mm512_slli_epi32(_mm512_and_si512(t, one), 4);
    for (int b = 1; b < 4; ++b)
      out = _mm512_or_si512(out, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(t, b), one), 8 * b + 4));
    return out;
  };
  for (int st = 0; st < 4; ++st) {
    const __m512i v = gather(qs + 4 * st);
    __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), nib);
    if (type == 6) {
      lo = _mm512_or_si512(lo, spread(_mm512_srli_epi32(qh, 4 * st)));
      hi = _mm512_or_si512(hi, spread(_mm512_srli_epi32(qh, 16 + 4 * st)));
    }
    put(st, lo);
    put(st + 4, hi);
  }
}

}  // namespace

void matmul_q8k_legacy_rows_avx512_vnni(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  const int64_t G = a.K / kQK;
  static thread_local std::vector<LegacyPanel> panels;
  panels.resize(static_cast<size_t>(G));
  for (int64_t n0 = n_begin; n0 < n_end; n0 += 16) {
    const int rows = static_cast<int>(n_end - n0 < 16 ? n_end - n0 : 16);
    for (int64_t g = 0; g < G; ++g) panel(type, a, n0, rows, g, panels[g]);
    switch (type) {
      case 8: tiles<8>(panels.data(), G, a, M, n0, rows); break;
      case 6: tiles<6>(panels.data(), G, a, M, n0, rows); break;
      default: tiles<3>(panels.data(), G, a, M, n0, rows); break;
    }
  }
}

}  // namespace specdec::gguf
#pragma GCC pop_options

#else
#include <cstdlib>
#include "kernels/gguf/q8_tiers.h"
namespace specdec::gguf {
void matmul_q8k_legacy_rows_avx512_vnni(int32_t, const Q8Args&, int64_t, int64_t, int64_t) {
  std::abort();  // q8k_legacy_cpu.cpp runs this tier only where the CPU has it
}
}  // namespace specdec::gguf
#endif
