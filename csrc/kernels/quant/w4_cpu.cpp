// CPU W4A16 kernels (see w4_cpu.h for the layout): AVX-512 and AVX2+FMA intrinsics and a portable
// loop for baseline x86-64, picked once at load by kernels/common/cpu_isa.h (a default build
// targets baseline x86-64, so the wider ISAs come in through target attributes).
#include "kernels/quant/w4_cpu.h"

#include <algorithm>
#include <cstring>

#include "kernels/common/cpu_isa.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's own avx512fintrin.h trips -Wmaybe-uninitialized in _mm512_setzero_ps-style helpers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define SPECDEC_X86 1
#endif

namespace specdec::quant {
namespace {

constexpr int kMaxBlockM = 8;  // activation rows per pass over a tile (registers: see below)

// How far ahead of the decode the AVX-512 loop prefetches the packed weight, into L2: 8 KiB (half
// a tile at K = 2048) keeps more lines in flight than the L1's fill buffers allow; measured on
// this project's CPU (11264 x 2048 at M = 1, one thread): 1.55 ms without the L2 hint at 2 KiB,
// 1.34 ms with it at 8 KiB, 1.4 ms at 4 or 16 KiB.
constexpr int64_t kPrefetchBytes = 8192;

// Both loops accumulate (code - 8) * x per group unscaled and multiply by the 16 rows' scales
// once per group (group >= 32 input features), so the inner loop is decode + FMA only.

// ---- portable loop (baseline x86-64 / other CPUs; the 16-lane inner loops autovectorise) ------
template <int MB>
__attribute__((always_inline)) inline void tile_portable(const float* x, int64_t K,
                                                         const uint8_t* packed,
                                                         const float* scales, int64_t group,
                                                         float (*acc)[kCpuTileN]) {
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < kCpuTileN; ++j) acc[m][j] = 0.f;
  const int64_t groups = K / group;
  for (int64_t g = 0; g < groups; ++g) {
    float part[MB][kCpuTileN] = {};
    for (int64_t p = g * group / 2; p < (g + 1) * group / 2; ++p) {
      const uint8_t* b = packed + p * kCpuTileN;
      float w0[kCpuTileN], w1[kCpuTileN];
      for (int j = 0; j < kCpuTileN; ++j) {
        w0[j] = static_cast<float>(static_cast<int>(b[j] & 15) - 8);
        w1[j] = static_cast<float>(static_cast<int>(b[j] >> 4) - 8);
      }
      for (int m = 0; m < MB; ++m) {
        const float x0 = x[m * K + 2 * p], x1 = x[m * K + 2 * p + 1];
        for (int j = 0; j < kCpuTileN; ++j) part[m][j] += w0[j] * x0 + w1[j] * x1;
      }
    }
    const float* s = scales + g * kCpuTileN;
    for (int m = 0; m < MB; ++m)
      for (int j = 0; j < kCpuTileN; ++j) acc[m][j] += part[m][j] * s[j];
  }
}

template <int MB>
void tile_baseline(const float* x, int64_t K, const uint8_t* packed, const float* scales,
                   int64_t group, float (*acc)[kCpuTileN]) {
  tile_portable<MB>(x, K, packed, scales, group, acc);
}

#ifdef SPECDEC_X86
// ---- AVX2 -------------------------------------------------------------------------------------
// 16 ymm registers cannot hold 16-row accumulators for 8 activation rows, so the tile is run as
// two 8-row halves (the second half re-reads the tile from L2: 16 KiB per half at K = 4096). Per
// input-feature pair: vpmovzxbd of 8 bytes, and / shift, convert, one FMA each to apply the scale
// ((code - 8) * s = code * s - 8s, rounded once), then one FMA per activation row. Chains per row:
// MB <= 2 -> 4, MB <= 4 -> 2, else 1 (at most 8 accumulators + 5 constants / temporaries).
template <int MB>
__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, int64_t K,
                                                   const uint8_t* packed, const float* scales,
                                                   int64_t group, float (*acc_out)[kCpuTileN]) {
  constexpr int C = MB <= 2 ? 4 : (MB <= 4 ? 2 : 1);
  const __m256i low4 = _mm256_set1_epi32(15);
  const int64_t groups = K / group;
  for (int half = 0; half < 2; ++half) {
    __m256 acc[MB][C];
    for (int m = 0; m < MB; ++m)
      for (int c = 0; c < C; ++c) acc[m][c] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      const __m256 s = _mm256_loadu_ps(scales + g * kCpuTileN + 8 * half);
      const __m256 neg8s = _mm256_mul_ps(s, _mm256_set1_ps(-8.f));
      const int64_t p_end = (g + 1) * group / 2;
      for (int64_t p = g * group / 2; p < p_end; p += 2) {
        for (int u = 0; u < 2; ++u) {
          const __m256i b = _mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed + (p + u) * kCpuTileN + 8 * half)));
          const __m256 w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, low4)), s, neg8s);
          const __m256 w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), s, neg8s);
          for (int m = 0; m < MB; ++m) {
            const float* xm = x + m * K + 2 * (p + u);
            acc[m][(2 * u) % C] = _mm256_fmadd_ps(w0, _mm256_set1_ps(xm[0]), acc[m][(2 * u) % C]);
            acc[m][(2 * u + 1) % C] = _mm256_fmadd_ps(w1, _mm256_set1_ps(xm[1]), acc[m][(2 * u + 1) % C]);
          }
        }
      }
    }
    for (int m = 0; m < MB; ++m) {
      __m256 total = acc[m][0];
      for (int c = 1; c < C; ++c) total = _mm256_add_ps(total, acc[m][c]);
      _mm256_storeu_ps(acc_out[m] + 8 * half, total);
    }
  }
}

// ---- AVX-512 ----------------------------------------------------------------------------------
// Per input-feature pair: one vpmovzxbd (16 bytes -> 16 lanes); vpermps with a 16-entry table
// of the floats -8..7 decodes a nibble in one instruction (it reads only the low 4 bits of each
// lane, so the low nibble needs no mask; the high one a shift), then one FMA per activation row
// with x broadcast from memory. Small MB keeps several independent accumulator chains per row to
// hide the 4-cycle FMA latency: MB <= 2 -> 4 chains, MB <= 4 -> 2, else 1 (MB = 8: 8 group + 8
// total accumulators + 4 decoded + 2 loaded + table + scale = 24 of the 32 zmm registers).
template <int MB>
__attribute__((target("avx512f"))) void tile_avx512(const float* x, int64_t K,
                                                    const uint8_t* packed, const float* scales,
                                                    int64_t group, float (*acc_out)[kCpuTileN]) {
  constexpr int C = MB <= 2 ? 4 : (MB <= 4 ? 2 : 1);
  const __m512 table = _mm512_setr_ps(-8.f, -7.f, -6.f, -5.f, -4.f, -3.f, -2.f, -1.f, 0.f, 1.f,
                                      2.f, 3.f, 4.f, 5.f, 6.f, 7.f);
  __m512 total[MB];
  for (int m = 0; m < MB; ++m) total[m] = _mm512_setzero_ps();
  const int64_t groups = K / group;
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[MB][C];
    for (int m = 0; m < MB; ++m)
      for (int c = 0; c < C; ++c) acc[m][c] = _mm512_setzero_ps();
    const int64_t p_end = (g + 1) * group / 2;
    // group is a multiple of 32: 4 input features (2 pairs, 32 bytes) per step.
    for (int64_t p = g * group / 2; p < p_end; p += 2) {
      // The weight streams from memory once: ask for it kPrefetchBytes ahead (past the tile's end
      // that is the next tile, adjacent in LAYOUT_CPU; a prefetch never faults). Without it the
      // decode and the loads take turns and the kernel moves ~5 GB/s where fp32 GEMV moves ~13.
      _mm_prefetch(reinterpret_cast<const char*>(packed + p * kCpuTileN) + kPrefetchBytes, _MM_HINT_T1);
      const __m512i b0 = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + p * kCpuTileN)));
      const __m512i b1 = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + (p + 1) * kCpuTileN)));
      __m512 w[4];
      w[0] = _mm512_permutexvar_ps(b0, table);
      w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(b0, 4), table);
      w[2] = _mm512_permutexvar_ps(b1, table);
      w[3] = _mm512_permutexvar_ps(_mm512_srli_epi32(b1, 4), table);
      for (int m = 0; m < MB; ++m) {
        const float* xm = x + m * K + 2 * p;
        for (int i = 0; i < 4; ++i)
          acc[m][i % C] = _mm512_fmadd_ps(w[i], _mm512_set1_ps(xm[i]), acc[m][i % C]);
      }
    }
    const __m512 s = _mm512_loadu_ps(scales + g * kCpuTileN);
    for (int m = 0; m < MB; ++m) {
      __m512 part = acc[m][0];
      for (int c = 1; c < C; ++c) part = _mm512_add_ps(part, acc[m][c]);
      total[m] = _mm512_fmadd_ps(part, s, total[m]);
    }
  }
  for (int m = 0; m < MB; ++m) _mm512_storeu_ps(acc_out[m], total[m]);
}
#endif

using TileFn = void (*)(const float*, int64_t, const uint8_t*, const float*, int64_t,
                        float (*)[kCpuTileN]);

// The widest tier SPECDEC_CPU_ISA allows on this CPU (kernels/common/cpu_isa.h); the AVX-512 loop
// uses AVX-512F only.
const bool kAvx512 = cpu_avx512f_enabled();
const bool kAvx2 = !kAvx512 && cpu_avx2_fma_enabled();

template <int MB>
TileFn pick() {
#ifdef SPECDEC_X86
  if (kAvx512) return &tile_avx512<MB>;
  if (kAvx2) return &tile_avx2<MB>;
#endif
  return &tile_baseline<MB>;
}

TileFn tile_fn(int mb) {
  switch (mb) {
    case 1: return pick<1>();
    case 2: return pick<2>();
    case 3: return pick<3>();
    case 4: return pick<4>();
    case 5: return pick<5>();
    case 6: return pick<6>();
    case 7: return pick<7>();
    default: return pick<8>();
  }
}

}  // namespace

const char* w4a16_cpu_isa() {
  return kAvx512 ? "avx512" : (kAvx2 ? "avx2" : "baseline");
}

void w4a16_matmul_cpu_tiles(const float* x, int64_t M, int64_t K, const uint8_t* packed,
                            const float* scales, int64_t group, float* y, int64_t N,
                            int64_t tile_begin, int64_t tile_end) {
  const int64_t groups = K / group;
  float acc[kMaxBlockM][kCpuTileN];
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile_packed = packed + t * (K / 2) * kCpuTileN;
    const float* tile_scales = scales + t * groups * kCpuTileN;
    const int64_t n0 = t * kCpuTileN;
    const int64_t rows = std::min<int64_t>(kCpuTileN, N - n0);
    // Blocks of up to 8 activation rows; the tile (K/2 * 16 bytes, 32 KiB at K = 4096) is still
    // in L2 when the next block re-reads it.
    for (int64_t m0 = 0; m0 < M; m0 += kMaxBlockM) {
      const int mb = static_cast<int>(std::min<int64_t>(kMaxBlockM, M - m0));
      tile_fn(mb)(x + m0 * K, K, tile_packed, tile_scales, group, acc);
      for (int m = 0; m < mb; ++m) std::memcpy(y + (m0 + m) * N + n0, acc[m], rows * sizeof(float));
    }
  }
}

void w4_dequantize_cpu_tiles(const uint8_t* packed, const float* scales, int64_t K, int64_t group,
                             float* weight, int64_t N, int64_t tile_begin, int64_t tile_end) {
  const int64_t groups = K / group;
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const uint8_t* tile_packed = packed + t * (K / 2) * kCpuTileN;
    const float* tile_scales = scales + t * groups * kCpuTileN;
    for (int j = 0; j < kCpuTileN; ++j) {
      const int64_t n = t * kCpuTileN + j;
      if (n >= N) break;
      float* row = weight + n * K;
      for (int64_t p = 0; p < K / 2; ++p) {
        const uint8_t b = tile_packed[p * kCpuTileN + j];
        const float s = tile_scales[(2 * p / group) * kCpuTileN + j];
        row[2 * p] = static_cast<float>(static_cast<int>(b & 15) - 8) * s;
        row[2 * p + 1] = static_cast<float>(static_cast<int>(b >> 4) - 8) * s;
      }
    }
  }
}

}  // namespace specdec::quant
