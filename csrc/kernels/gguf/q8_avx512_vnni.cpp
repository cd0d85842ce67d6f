// The AVX-512 + VNNI tier of the Q8-activation GGUF matmul: q8_avx512.cpp's kernel with the sums of
// 4 adjacent u8 x s8 products (Q6_K, Q5_0) in one vpdpbusd instead of vpmaddubsw + vpmaddwd, and,
// for every format against 2 or more rows of x, the lane dots (q8_body.h) over x's codes
// transposed per call; for Q4_K_LANES and Q6_K_LANES (repacked at load, blocks.h) the lane dots at
// every row count, with no transpose of W. At one row of x (the file's formats) x's codes are
// stored twice over per call (Q8Args::xd): a 64-byte operand where a broadcast cost Zen 4 a
// shuffle (one row of x: Q5_0 9.75 -> 9.25 ns per 256 weights, Q4_1 9.8 -> 8.9, Q4_K 8.3 -> 7.8;
// 5 rows Q5_0 25.2 -> 22.7, bench/bench_gguf_compute.py). The integers, hence the bits, are those of the other tiers
// (q8_vec_avx512.h).
#include "kernels/gguf/q8_tiers.h"

#if defined(__x86_64__)
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/gguf/blocks.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
// GCC 12's avx512fintrin.h trips -Wmaybe-uninitialized in _mm512_setzero_ps-style helpers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace specdec::gguf {
namespace {
#include "kernels/gguf/q8_body.h"
#include "kernels/gguf/q8_vec_avx2.h"
#include "kernels/gguf/q8_vec_avx512.h"
}  // namespace

namespace {

// Rows of x from which Q4_K and Q6_K run their lane dots (q8_body.h: q4_k_body<true>, q6_k_body<true>): at
// one row the transpose of the weights' registers costs what the reduce it replaces does (Q4_K
// 7.6 -> 7.9 ns per super-block); at 5 rows 20.1 -> 16.0 (Q4_K) and 23.4 -> 19.6 (Q6_K), and a
// 5-row verification of the real 1.5B 89 -> 79 ms (bench/bench_gguf_compute.py,
// bench/bench_real_step.py). The legacy formats' (q8_body.h, octet) from the same count.
constexpr int64_t kLaneDotMinRows = 2;

// Whether this call runs the lane dots over x's transposed codes: lane-order weights always, every
// file format from kLaneDotMinRows rows of x (one row: the plain bodies over x's doubled codes).
bool lane_dots(int32_t type, int64_t M) {
  return is_lanes(type) || M >= kLaneDotMinRows;
}

// xt = x's codes with each octet's 8 x 8 dwords transposed (Q8Args::xt: row m at codes_t(m)), two
// octets at a time, then one on its own; groups past K (a legacy row whose K is not a multiple of
// 256: the 0.5B's 896) are zeros, so they add nothing whatever W's lanes hold.
void transpose_codes(const Q8Args& a, int64_t M, int8_t* xt) {
  const int64_t T = a.octets(), G = a.K / 32;
  const auto group = [&](const int8_t* q, int64_t t, int j) {
    return 8 * t + j < G ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 256 * t + 32 * j))
                         : _mm256_setzero_si256();
  };
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* q = a.codes(m);
    int8_t* out = xt + m * 512 * T;
    for (int64_t t = 0; t < T; t += 2) {
      const bool pair = t + 1 < T;
      __m512i v[8];
      for (int j = 0; j < 8; ++j) {
        const __m256i hi = pair ? group(q, t + 1, j) : _mm256_setzero_si256();
        v[j] = _mm512_inserti64x4(_mm512_castsi256_si512(group(q, t, j)), hi, 1);
      }
      V512Q8<true>::transpose8(v);
      for (int i = 0; i < 8; ++i) {  // each octet's 32-byte chunk i, twice over
        _mm512_storeu_si512(out + 512 * t + 64 * i, _mm512_shuffle_i64x2(v[i], v[i], 0x44));
        if (pair) _mm512_storeu_si512(out + 512 * (t + 1) + 64 * i, _mm512_shuffle_i64x2(v[i], v[i], 0xee));
      }
    }
  }
}

// xd [M, 2K] = x's codes with each 32-byte group stored twice over (Q8Args::xd).
void double_codes(const Q8Args& a, int64_t M, int8_t* xd) {
  for (int64_t m = 0; m < M; ++m) {
    const int8_t* q = a.codes(m);
    for (int64_t g = 0; g < a.K / 32; ++g) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * g));
      _mm512_storeu_si512(xd + 2 * (m * a.K + 32 * g), _mm512_broadcast_i64x4(v));
    }
  }
}

// Rows [n_begin, n_end) of a lane-order weight (Q4_K_LANES, Q6_K_LANES: blocks.h): pairs of rows
// as their format's lane dots with no transpose of W; an odd last row goes back to the file's
// order in a buffer and runs V256's loop.
void lanes_rows(int32_t type, const Q8Args& lanes, int64_t M, int64_t n_begin, int64_t n_end) {
  const int32_t file = file_type(type);
  const int64_t pairs_end = n_begin + (n_end - n_begin) / 2 * 2;
  Q8Args pairs = lanes;
  pairs.w_lanes = true;
  q8_rows<V512Q8<true>, 8>(file, pairs, M, n_begin, pairs_end);
  if (pairs_end == n_end) return;
  static thread_local std::vector<uint8_t> row;
  row.resize(static_cast<size_t>(lanes.row_bytes));
  blocks_from_lanes(type, lanes.weight + pairs_end * lanes.row_bytes, lanes.row_bytes, row.data());
  Q8Args last = lanes;
  last.weight = row.data();
  last.y = lanes.y + pairs_end;
  last.xt = nullptr;
  q8_rows<V256, 8>(file, last, M, 0, 1);
}

}  // namespace

void matmul_q8_rows_avx512_vnni(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  const bool repacked = is_lanes(type);
  if (lane_dots(type, M)) {
    // Per call (a thread's chunk of rows of W): x's few rows are transposed again, a few
    // microseconds against the chunk's ~100 KiB and more of blocks.
    static thread_local std::vector<int8_t> xt;
    xt.resize(static_cast<size_t>(M * 512 * a.octets()));
    transpose_codes(a, M, xt.data());
    Q8Args lanes = a;
    lanes.xt = xt.data();
    if (repacked) {
      lanes_rows(type, lanes, M, n_begin, n_end);
    } else {
      q8_rows_avx512<true>(type, lanes, M, n_begin, n_end);
    }
    return;
  }
  static thread_local std::vector<int8_t> xd;
  xd.resize(static_cast<size_t>(M * 2 * a.K));
  double_codes(a, M, xd.data());
  Q8Args doubled = a;
  doubled.xd = xd.data();
  q8_rows_avx512<true>(type, doubled, M, n_begin, n_end);
}

}  // namespace specdec::gguf
#pragma GCC pop_options

#else
namespace specdec::gguf {
void matmul_q8_rows_avx512_vnni(int32_t type, const Q8Args& a, int64_t M, int64_t n_begin, int64_t n_end) {
  matmul_q8_rows_portable(type, a, M, n_begin, n_end);
}
}  // namespace specdec::gguf
#endif
