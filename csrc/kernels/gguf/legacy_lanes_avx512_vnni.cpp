// The legacy formats (Q8_0, Q5_0, Q4_1) with 16 rows of W in the vector lanes, AVX-512 VNNI: the
// Q8K mode's legacy order (q8k.h, a prompt's prefill) and, from panels (panels.h), q8.h's own order
// (decoding and verification), as q8k_avx512_vnni.cpp does for the k-quants.
//
// Per call (a thread's rows [n_begin, n_end) of W, all M rows of x), for each group of 16 rows and
// each block column g of 32 weights:
//   1. the codes as 8 steps of [16 rows][4 codes] unsigned (Q8_0 w + 128, Q5_0 its 5-bit code
//      w + 16, Q4_1 its nibble) and d (Q4_1: and m) as float lanes: read from a panel layout (a
//      step is one load, a nibble split and for Q5_0 its fifth bits), or gathered from the file's
//      rows into one panel;
//   2. for each tile of MB <= 4 rows of x: acc[i] starts at -c Σq (c = 128, 16, 0: what the unsigned
//      codes add) and takes 8 vpdpbusd of the steps with 4 codes of x broadcast, so lane r holds the
//      integer of output n0 + r that q8.h's and q8k.h's orders share (legacy_group.h); then that
//      order's float steps into the row's accumulators: q8k.h's one, or q8.h's eight (A[g % 8],
//      summed as q8.h's tree at the end). The same integers and float operations in the same
//      order as the portable tiers, so the same bits.
// Block column outer, rows of x inner: each panel is read from memory once while every row of x
// multiplies it, and panels are prefetched ahead (as the k-quants', q8k_avx512_vnni.cpp).
#include "kernels/gguf/q8_tiers.h"

#if defined(__x86_64__)
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/gguf/blocks.h"
#include "kernels/gguf/panels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace specdec::gguf {
namespace {

// Block column g of 16 rows of W as the tiles read it: codes [8 steps][16 rows][4] (u8), d and m.
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
constexpr int32_t code_offset(int32_t file) { return file == 8 ? 128 : file == 6 ? 16 : 0; }

// How far ahead of the panel being multiplied each block column's lines are prefetched into L2
// (about the k-quants' 4 panels; an asm statement, as there: GCC dropped the builtin in such loops).
constexpr int64_t kAheadBytes = 8192;

// Block column g of rows n0 .. n0 + 15 into `p`: gathered from the file's rows (valid: the rows
// that exist; d = m = 0 past them), each step's dword of 4 codes from the 16 rows' blocks.
void gather_panel(int32_t file, const Q8Args& a, int64_t n0, __mmask16 valid, int64_t g, LegacyPanel& p) {
  const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_epi32(static_cast<int32_t>(a.row_bytes)));
  const uint8_t* base = a.weight + n0 * a.row_bytes + g * block_bytes(file);
  auto gather = [&](int64_t off) {  // the dword at byte `off` of each row's block
    return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), valid, idx, base + off, 1);
  };
  auto put = [&](int step, __m512i v) { _mm512_store_si512(p.w + step * 64, v); };
  const __m512i head = gather(0);  // d (and Q4_1's m) in fp16
  _mm512_store_ps(p.d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head)));
  _mm512_store_ps(p.m, file == 3 ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)))
                                 : _mm512_setzero_ps());
  const __m512i nib = _mm512_set1_epi32(0x0f0f0f0f);
  if (file == 8) {  // qs at byte 2: w + 128 is the byte with its top bit flipped
    for (int st = 0; st < 8; ++st)
      put(st, _mm512_xor_si512(gather(2 + 4 * st), _mm512_set1_epi32(static_cast<int32_t>(0x80808080u))));
    return;
  }
  // Q4_1: qs at byte 4; Q5_0: qh (bit k: weight k's fifth bit) at 2, qs at 6. Weight k < 16 is
  // the low nibble of qs[k], k >= 16 the high nibble of qs[k - 16].
  const int64_t qs = file == 3 ? 4 : 6;
  const __m512i qh = file == 6 ? gather(2) : _mm512_setzero_si512();
  const __m512i one = _mm512_set1_epi32(1);
  auto spread = [&](__m512i t) {  // bits 0..3 of t to bit 4 of bytes 0..3
    __m512i out = _mm512_slli_epi32(_mm512_and_si512(t, one), 4);
    for (int b = 1; b < 4; ++b)
      out = _mm512_or_si512(out, _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(t, b), one), 8 * b + 4));
    return out;
  };
  for (int st = 0; st < 4; ++st) {
    const __m512i v = gather(qs + 4 * st);
    __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), nib);
    if (file == 6) {
      lo = _mm512_or_si512(lo, spread(_mm512_srli_epi32(qh, 4 * st)));
      hi = _mm512_or_si512(hi, spread(_mm512_srli_epi32(qh, 16 + 4 * st)));
    }
    put(st, lo);
    put(st + 4, hi);
  }
}

// Where a tile reads block column g's codes (step st: a zmm of [16 rows][4 codes]) and scales.
struct GatheredColumn {  // gathered from the file's rows into a LegacyPanel
  const LegacyPanel& p;
  __m512i step(int st) const { return _mm512_load_si512(p.w + st * 64); }
  __m512 d() const { return _mm512_load_ps(p.d); }
  __m512 m() const { return _mm512_load_ps(p.m); }
};

template <int32_t kFile>
struct PanelColumn {  // read straight from a panel (panels.h's legacy layouts), decoded per step
  const uint8_t* panel;
  __m512i step(int st) const {
    if constexpr (kFile == 8) return _mm512_loadu_si512(panel + 64 * st);
    const __m512i v = _mm512_loadu_si512(panel + 64 * (st >> 1));
    const __m512i nib = _mm512_set1_epi32(0x0f0f0f0f);
    __m512i code = _mm512_and_si512((st & 1) ? _mm512_srli_epi32(v, 4) : v, nib);
    if constexpr (kFile == 6) {  // bit st of each byte of the fifth bits, to bit 4
      const __m512i hi = _mm512_loadu_si512(panel + 256);
      const __m512i moved = st <= 4 ? _mm512_slli_epi32(hi, 4 - st) : _mm512_srli_epi32(hi, st - 4);
      code = _mm512_or_si512(code, _mm512_and_si512(moved, _mm512_set1_epi32(0x10101010)));
    }
    return code;
  }
  __m512 d() const {
    if constexpr (kFile == 3) return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_loadu_si512(panel + 256)));
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + (kFile == 8 ? 512 : 320))));
  }
  __m512 m() const {  // Q4_1's
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_loadu_si512(panel + 256), 16)));
  }
};

// Block column g (codes from col) against rows m0 .. m0 + MB - 1 of x: the float steps into acc
// (row m's accumulators at acc + 16 kLanes m; kLanes 8: q8.h's lane g % 8, 1: q8k.h's one). Two
// integer chains per row (steps 0-3, 4-7), added at the end: exact, and half the latency.
template <int MB, int32_t kFile, int kLanes, class Column>
void tile(const Column& col, const Q8Args& a, int64_t g, int64_t m0, float* acc) {
  int32_t qsum[MB];
  __m512i lo[MB], hi[MB];
  for (int i = 0; i < MB; ++i) {
    const int16_t* s = a.sums(m0 + i);
    qsum[i] = static_cast<int32_t>(s[2 * g]) + s[2 * g + 1];
    lo[i] = _mm512_set1_epi32(-code_offset(kFile) * qsum[i]);
    hi[i] = _mm512_setzero_si512();
  }
#pragma GCC unroll 4
  for (int st = 0; st < 4; ++st) {
    const __m512i w0 = col.step(st), w1 = col.step(st + 4);
    for (int i = 0; i < MB; ++i) {
      const int8_t* q = a.codes(m0 + i) + 32 * g;
      lo[i] = _mm512_dpbusd_epi32(lo[i], w0, bcast32(q + 4 * st));
      hi[i] = _mm512_dpbusd_epi32(hi[i], w1, bcast32(q + 16 + 4 * st));
    }
  }
  const __m512 d = col.d();
  for (int i = 0; i < MB; ++i) {
    float* A = acc + 16 * (kLanes * (m0 + i) + (kLanes == 8 ? g % 8 : 0));
    const __m512 x = _mm512_set1_ps(a.scales(m0 + i)[g]);
    const __m512i dot = _mm512_add_epi32(lo[i], hi[i]);
    __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, x), _mm512_load_ps(A));
    if constexpr (kFile == 3)
      v = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(qsum[i])), _mm512_mul_ps(col.m(), x), v);
    _mm512_store_ps(A, v);
  }
}

template <int32_t kFile, int kLanes, class Column>
void tiles(const Column& col, const Q8Args& a, int64_t M, int64_t g, float* acc) {
  int64_t m0 = 0;
  for (; m0 + 4 <= M; m0 += 4) tile<4, kFile, kLanes>(col, a, g, m0, acc);
  switch (M - m0) {
    case 3: tile<3, kFile, kLanes>(col, a, g, m0, acc); break;
    case 2: tile<2, kFile, kLanes>(col, a, g, m0, acc); break;
    case 1: tile<1, kFile, kLanes>(col, a, g, m0, acc); break;
    default: break;
  }
}

template <int32_t kFile, int kLanes>
void group(const uint8_t* panels, const Q8Args& a, int64_t M, int64_t n0, __mmask16 valid, __mmask16 mask) {
  struct alignas(64) Lanes {
    float v[16];
  };
  static thread_local std::vector<Lanes> acc_rows;  // kLanes zmm accumulators per row of x
  acc_rows.assign(static_cast<size_t>(kLanes * M), Lanes{});
  float* acc = acc_rows.data()->v;
  const int64_t G = a.K / kQK, pb = kPanelRows * block_bytes(kFile);
  LegacyPanel p;
  for (int64_t g = 0; g < G; ++g) {
    if (panels != nullptr) {
      const char* ahead = reinterpret_cast<const char*>(panels + g * pb + kAheadBytes);
      for (int64_t off = 0; off < pb; off += 64) asm volatile("prefetcht1 %0" : : "m"(ahead[off]));
      tiles<kFile, kLanes>(PanelColumn<kFile>{panels + g * pb}, a, M, g, acc);
    } else {
      gather_panel(kFile, a, n0, valid, g, p);
      tiles<kFile, kLanes>(GatheredColumn{p}, a, M, g, acc);
    }
  }
  for (int64_t m = 0; m < M; ++m) {
    const float* A = acc + 16 * kLanes * m;
    __m512 y = _mm512_load_ps(A);
    if constexpr (kLanes == 8) {  // q8.h's end: ((A0 + A4) + (A2 + A6)) + ((A1 + A5) + (A3 + A7))
      auto lane = [&](int j) { return _mm512_load_ps(A + 16 * j); };
      y = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(lane(0), lane(4)), _mm512_add_ps(lane(2), lane(6))),
                        _mm512_add_ps(_mm512_add_ps(lane(1), lane(5)), _mm512_add_ps(lane(3), lane(7))));
    }
    _mm512_mask_storeu_ps(a.y + m * a.ldy + n0, mask, y);
  }
}

template <int kLanes>
void rows_of(int32_t file, const uint8_t* panels, const Q8Args& a, int64_t M, int64_t n0, __mmask16 valid,
             __mmask16 mask) {
  switch (file) {
    case 8: group<8, kLanes>(panels, a, M, n0, valid, mask); break;
    case 6: group<6, kLanes>(panels, a, M, n0, valid, mask); break;
    default: group<3, kLanes>(panels, a, M, n0, valid, mask); break;
  }
}

}  // namespace

void legacy_lanes_rows(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end, bool q8_order) {
  const int32_t file = file_type(type);
  const bool panels = is_panels(type);
  for (int64_t n0 = panels ? n_begin / kPanelRows * kPanelRows : n_begin; n0 < n_end; n0 += kPanelRows) {
    // panels: the group holding n0, lanes [lo, hi) stored; the file's rows: rows n0 .. n0 + 15 that exist
    const int64_t lo = std::max(n_begin, n0) - n0, hi = std::min(n_end, n0 + kPanelRows) - n0;
    const __mmask16 valid = static_cast<__mmask16>((1u << hi) - 1u);
    const __mmask16 mask = static_cast<__mmask16>(valid & ~((1u << lo) - 1u));
    const uint8_t* group_panels = panels ? a.weight + n0 * a.row_bytes : nullptr;
    if (q8_order) {
      rows_of<8>(file, group_panels, a, M, n0, valid, mask);
    } else {
      rows_of<1>(file, group_panels, a, M, n0, valid, mask);
    }
  }
}

}  // namespace specdec::gguf
#pragma GCC pop_options

#else
#include <cstdlib>
namespace specdec::gguf {
void legacy_lanes_rows(int32_t, const Q8Args&, int64_t, int64_t, int64_t, bool) {
  std::abort();  // its callers run it only where the CPU has AVX-512 VNNI
}
}  // namespace specdec::gguf
#endif
