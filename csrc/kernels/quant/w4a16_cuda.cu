// W4A16 on tensor cores for small M (drafting and verification: M = 1..16 per launch), and the
// dequantiser the glue uses for the dense (cuBLAS) path at large M. Both read LAYOUT_CUDA
// (python/specdec_cuda/reference/quant.py has it bit by bit; w4a16_cuda.h in short).
//
// The product is y[M, N] = x[M, K] · Wᵀ computed as mma.sync.m16n8k16 (fp16 / bf16 in, fp32
// accumulate) with x as operand A (M padded to 16 rows, rows >= M zero-filled) and W as operand B
// (k x n). At M <= 16 the kernel is a stream over the int4 weight: everything below serves to
// keep enough of it in flight and to turn each byte into mma fragments with a few ALU operations.
//
// Work decomposition (shown for the default block of WARPS = 4 warps and TN = 2 n8 tiles = 16
// output columns; other launch configurations are in kTunings below):
//
//                 K ->  chunk 0 .. chunk C/4-1 | chunk C/4 .. | ...        | .. chunk C-1
//   tile 2b   (n8)    [        warp 0         |    warp 1    |   warp 2   |   warp 3   ]
//   tile 2b+1 (n8)    [        warp 0         |    warp 1    |   warp 2   |   warp 3   ]
//                      (chunk = 128 input features; C = ceil(K / 128))
//
//   block b = blockIdx.x owns 16 output columns; its 4 warps split K into 4 contiguous ranges
//   (split-K inside the block), and a 4 KiB shared-memory sum at the end adds the 4 warp partials.
//   N = 4096 gives 256 blocks x 4 warps, about 2 blocks on each of 132 SMs, each with up to
//   STAGES x 4 KiB of weight in flight; larger N gives more blocks.
//
// One (tile, chunk) of LAYOUT_CUDA is 512 contiguous bytes: lane l = 4g + t reads its 16 bytes at
// offset 16 l. Those are the 32 codes of row g of the tile at k = 128c + 32t .. 128c + 32t + 31,
// which is exactly what the lane's B fragments (column g, mma rows 2t, 2t+1, 2t+8, 2t+9) need
// over the chunk's 8 k-steps once mma row kappa of step s is mapped to input feature
// 128c + 32t(kappa) + 4s + 2(kappa >= 8) + (kappa & 1); x's columns are permuted the same way, so
// lane (g, t)'s A fragments come from x[g, 128c + 32t ..] and x[g + 8, ...] (64 contiguous bytes
// per row):
//
//   lane (g, t), chunk c:  weights  W[8nt + g, 128c + 32t + (0..31)]   1 x 16 B per tile
//                          x        x[g (+8), 128c + 32t + (0..31)]     4 x 16 B per 8 rows
//   step s uses elements 4s..4s+3 of both: A = {x[g][4s,4s+1], x[g+8][4s,4s+1], x[g][4s+2,4s+3],
//   x[g+8][4s+2,4s+3]}, B = {W[4s,4s+1], W[4s+2,4s+3]} (each a pair of 16-bit values).
//   For M <= 8 the A tile's rows 8..15 are not needed, and the kernel feeds the 16 bytes of row g
//   it loaded as the A registers unchanged (no register shuffling): rows g then pair elements
//   (0,1), (4,5) of the 8 with weights (0,1), (4,5) in one mma, rows g + 8 elements (2,3), (6,7) with
//   weights (2,3), (6,7) in a second one (a second accumulator), and the epilogue adds the two.
//
// Pipeline: every thread copies its own bytes with cp.async into a per-thread slot ring of STAGES
// chunks in shared memory (weights .cg, i.e. L2 only, under an evict-first L2 policy since they
// are read once; x and scales .ca, since every block reads them), waits with cp.async.wait_group
// and reads back only what it copied itself, so the main loop needs no barrier at all.
// Out-of-range tiles and features past K are zero-filled by the copy (src-size 0), never read;
// activation rows >= M are neither copied nor read.
//
// Dequantisation (per 32-bit word = 8 codes = the B fragments of two k-steps; the interleave
// differs by dtype, see the reference):
//   fp16: lop3 (q & 0x000f000f) | 0x64006400 = half2(1024 + c, 1024 + c'), and the 0x00f000f0 mask
//         gives 1024 + 16c (in place, no shift); one shift by 8 serves the other two registers.
//         Then (r - 1032) resp. (r / 16 - 72) = code - 8 exactly, times the scale.
//   bf16: codes must sit in bits 0..3 of each 16-bit half (7 mantissa bits), so lo = q & 0x0f0f0f0f,
//         hi = (q >> 4) & 0x0f0f0f0f, and one prmt per register inserts the exponent byte 0x43
//         (bf16x2 (128 + c, 128 + c')); then (r - 136) * scale.
// Groups are multiples of 32, so the 32 codes of a lane share one scale per tile and chunk: the
// weight is rounded to the activation dtype once, like w4_dequantize's, and the mma accumulates
// in fp32.
#include "kernels/quant/w4a16_cuda.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <cstring>
#include <utility>

namespace specdec::quant {
namespace {

constexpr int kDeviceCache = 64;  // devices whose compute capability is cached

constexpr int kTileN = static_cast<int>(kCudaTileN);    // 8
constexpr int kChunkK = static_cast<int>(kCudaChunkK);  // 128

// ---- PTX wrappers ---------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// An L2 policy that evicts first what it covers: for the weight stream, read exactly once, so that
// it does not push x, the scales (re-read by every block) or the caller's other data out of L2.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// 16 bytes global -> shared (dst: a shared-window address) through L2 only, under `policy`;
// src_bytes = 0 reads nothing and zero-fills the destination.
__device__ __forceinline__ void cp_async_cg16(uint32_t dst, const void* src, int src_bytes, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(__cvta_generic_to_global(src)), "r"(src_bytes), "l"(policy)
               : "memory");
}

// 16 bytes global -> shared, cached in L1 too.
__device__ __forceinline__ void cp_async_ca16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(__cvta_generic_to_global(src)),
               "r"(src_bytes)
               : "memory");
}

// 4 bytes global -> shared, cached in L1 too.
__device__ __forceinline__ void cp_async_ca4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(__cvta_generic_to_global(src)),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// d = (a & b) | c in one instruction (LUT 0xea = (0xf0 & 0xcc) | 0xaa).
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// The bits of a 32-bit register value reread as another 32-bit type (uint32_t <-> half2 / bf16x2).
template <typename To, typename From>
__device__ __forceinline__ To bit_cast(From from) {
  static_assert(sizeof(To) == 4 && sizeof(From) == 4, "32-bit register types");
  To to;
  memcpy(&to, &from, 4);
  return to;
}

// ---- per-dtype dequantisation and mma ---------------------------------------------------------

template <ActDType D>
struct Ops;

template <>
struct Ops<ActDType::kFloat16> {
  using T = __half;
  // nibble p of a word holds the code of j = nibble_j(p) (reference NIBBLE_ORDER[float16])
  static constexpr __host__ __device__ int nibble_j(int p) { return p < 4 ? 2 * p : 2 * (p - 4) + 1; }

  // q: one LAYOUT_CUDA word (codes j = 0..7 of a lane's 8-feature run); scale2: the lane's scale in
  // both halves. b[0], b[1]: B registers (rows 2t..2t+1, 2t+8..2t+9) of the first k-step, b[2],
  // b[3] of the second; each (code - 8) * scale rounded to fp16.
  static __device__ __forceinline__ void dequant(uint32_t q, uint32_t scale2, uint32_t (&b)[4]) {
    constexpr uint32_t kLow = 0x000f000fu, kHigh = 0x00f000f0u, kExp = 0x64006400u;
    const __half2 bias_low = bit_cast<__half2>(0x64086408u);   // 1032 = 1024 + 8
    const __half2 sixteenth = bit_cast<__half2>(0x2c002c00u);  // 1/16
    const __half2 bias_high = bit_cast<__half2>(0xd480d480u);  // -72 = -(1024 / 16 + 8)
    const __half2 s = bit_cast<__half2>(scale2);
    const uint32_t q8 = q >> 8;
    const __half2 r0 = bit_cast<__half2>(and_or(q, kLow, kExp));    // 1024 + (j0, j1)
    const __half2 r1 = bit_cast<__half2>(and_or(q, kHigh, kExp));   // 1024 + 16 (j2, j3)
    const __half2 r2 = bit_cast<__half2>(and_or(q8, kLow, kExp));   // 1024 + (j4, j5)
    const __half2 r3 = bit_cast<__half2>(and_or(q8, kHigh, kExp));  // 1024 + 16 (j6, j7)
    b[0] = bit_cast<uint32_t>(__hmul2(__hsub2(r0, bias_low), s));
    b[1] = bit_cast<uint32_t>(__hmul2(__hfma2(r1, sixteenth, bias_high), s));
    b[2] = bit_cast<uint32_t>(__hmul2(__hsub2(r2, bias_low), s));
    b[3] = bit_cast<uint32_t>(__hmul2(__hfma2(r3, sixteenth, bias_high), s));
  }

  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }

  static __device__ __forceinline__ float to_float(T v) { return __half2float(v); }
  static __device__ __forceinline__ T from_float(float v) { return __float2half_rn(v); }
};

template <>
struct Ops<ActDType::kBFloat16> {
  using T = __nv_bfloat16;
  // reference NIBBLE_ORDER[bfloat16]: byte i of a word is j_i | j_(i+4) << 4
  static constexpr __host__ __device__ int nibble_j(int p) { return (p & 1) ? 4 + p / 2 : p / 2; }

  static __device__ __forceinline__ void dequant(uint32_t q, uint32_t scale2, uint32_t (&b)[4]) {
    const uint32_t lo = q & 0x0f0f0f0fu;         // bytes: j0 j1 j2 j3
    const uint32_t hi = (q >> 4) & 0x0f0f0f0fu;  // bytes: j4 j5 j6 j7
    // prmt: result bytes (lo.b0, 0x43, lo.b1, 0x43) = bf16x2 (128 + j0, 128 + j1), etc.
    constexpr uint32_t kExp = 0x43u;  // byte 4 of the permute pool
    const __nv_bfloat162 bias = bit_cast<__nv_bfloat162>(0x43084308u);  // 136 = 128 + 8
    const __nv_bfloat162 s = bit_cast<__nv_bfloat162>(scale2);
    const __nv_bfloat162 r0 = bit_cast<__nv_bfloat162>(__byte_perm(lo, kExp, 0x4140u));
    const __nv_bfloat162 r1 = bit_cast<__nv_bfloat162>(__byte_perm(lo, kExp, 0x4342u));
    const __nv_bfloat162 r2 = bit_cast<__nv_bfloat162>(__byte_perm(hi, kExp, 0x4140u));
    const __nv_bfloat162 r3 = bit_cast<__nv_bfloat162>(__byte_perm(hi, kExp, 0x4342u));
    b[0] = bit_cast<uint32_t>(__hmul2(__hsub2(r0, bias), s));
    b[1] = bit_cast<uint32_t>(__hmul2(__hsub2(r1, bias), s));
    b[2] = bit_cast<uint32_t>(__hmul2(__hsub2(r2, bias), s));
    b[3] = bit_cast<uint32_t>(__hmul2(__hsub2(r3, bias), s));
  }

  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }

  static __device__ __forceinline__ float to_float(T v) { return __bfloat162float(v); }
  static __device__ __forceinline__ T from_float(float v) { return __float2bfloat16_rn(v); }
};

// ---- the tensor-core kernel -------------------------------------------------------------------

// MT: activation rows the kernel takes (1: only row 0, i.e. lanes g = 0, carry x; 8: one 8-row
// half of the A tile, rows 8..15 constant zero; 16: both halves); TN: n8 tiles per block; STAGES:
// chunks in flight per warp; WARPS: warps per block, splitting K between them.
template <int MT, int TN, int STAGES, int WARPS>
struct MmaConfig {
  static_assert(MT == 1 || MT == 8 || MT == 16, "MT is 1, 8 or 16");
  static_assert(TN >= 1 && TN <= WARPS, "one warp writes each tile's result");
  static constexpr int kThreads = 32 * WARPS;
  static constexpr int kRowHalves = MT == 16 ? 2 : 1;
  // x slots per (row half, 16-byte piece q): one per lane, or for MT = 1 one per lane of group
  // g = 0 (lanes 0..3, the only ones holding row 0), which shrinks the ring by 7/8 of x's share.
  static constexpr int kXLanes = MT == 1 ? 4 : 32;
  // One stage of one warp's ring: [TN][32] uint4 weights, [kRowHalves][4][kXLanes] uint4 x,
  // [TN][32] uint32 scale pairs (every index lane-minor: conflict-free 16 / 4-byte accesses).
  static constexpr int kWeightBytes = TN * 32 * 16;
  static constexpr int kXBytes = kRowHalves * 4 * kXLanes * 16;
  static constexpr int kScaleBytes = TN * 32 * 4;
  static constexpr int kStageBytes = kWeightBytes + kXBytes + kScaleBytes;
  static constexpr int kRingBytes = STAGES * kStageBytes;      // per warp
  static constexpr int kSmemBytes = WARPS * kRingBytes;        // dynamic, per block
  static_assert(kStageBytes % 16 == 0, "16-byte aligned stages");
};

// x:      [M, ldx] (only columns < K read), 16-byte aligned rows
// packed: LAYOUT_CUDA [tiles, chunks, 32 lanes] uint4
// scales: [tiles, K / group, 8]
// y:      [M, ldy], columns < N written
template <ActDType D, int MT, int TN, int STAGES, int WARPS>
__global__ void __launch_bounds__(32 * WARPS)
    w4a16_mma_kernel(const typename Ops<D>::T* __restrict__ x, int64_t ldx, const uint4* __restrict__ packed,
                     const typename Ops<D>::T* __restrict__ scales, typename Ops<D>::T* __restrict__ y, int64_t ldy,
                     int M, int N, int K, int group) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  // bf16 mma.m16n8k16 and cp.async need sm_80; the launcher refuses older devices, this keeps
  // builds for them compiling.
  return;
#else
  using O = Ops<D>;
  using T = typename O::T;
  using Cfg = MmaConfig<MT, TN, STAGES, WARPS>;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ float partial[WARPS][TN][4][32];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;  // mma groupID / threadID_in_group
  const int tiles = (N + kTileN - 1) / kTileN;
  const int chunks = (K + kChunkK - 1) / kChunkK;
  const int groups = K / group;
  const int tile0 = blockIdx.x * TN;
  const int per_warp = (chunks + WARPS - 1) / WARPS;
  const int c_begin = min(chunks, warp * per_warp);
  const int c_end = min(chunks, c_begin + per_warp);

  unsigned char* const ring = smem + warp * Cfg::kRingBytes;
  auto slot_w = [&](int s) { return reinterpret_cast<uint4*>(ring + s * Cfg::kStageBytes); };
  auto slot_x = [&](int s) { return reinterpret_cast<uint4*>(ring + s * Cfg::kStageBytes + Cfg::kWeightBytes); };
  auto slot_s = [&](int s) {
    return reinterpret_cast<uint32_t*>(ring + s * Cfg::kStageBytes + Cfg::kWeightBytes + Cfg::kXBytes);
  };

  // Copy cursor. Chunks are copied in increasing order (c_begin, c_begin + 1, ...), so the source
  // pointers are set up once and advanced one chunk per copy: the loop does no index arithmetic.
  // Lanes whose tile is out of range keep a valid pointer and copy 0 bytes (zero-fill); lanes of
  // activation rows >= M copy nothing and read zeros instead (at M = 1, 7 of 8 x rows: this keeps
  // the ring's shared-memory traffic close to the weight bytes).
  const uint4* w_src[TN];  // packed[nt, c, lane]
  const T* s_src[TN];      // scales[nt, 0, g & ~1]: the aligned pair holding row g's scale
  int w_step[TN], tile_ok[TN];
#pragma unroll
  for (int i = 0; i < TN; ++i) {
    const int nt = tile0 + i;
    tile_ok[i] = nt < tiles;
    w_src[i] = packed + (tile_ok[i] ? (static_cast<int64_t>(nt) * chunks + c_begin) * 32 + lane : 0);
    w_step[i] = tile_ok[i] ? 32 : 0;
    s_src[i] = scales + (tile_ok[i] ? static_cast<int64_t>(nt) * groups * kTileN + (g & ~1) : 0);
  }
  const T* x_src[Cfg::kRowHalves];  // x[g + 8r, 128c + 32t]
  int row_ok[Cfg::kRowHalves];
#pragma unroll
  for (int r = 0; r < Cfg::kRowHalves; ++r) {
    row_ok[r] = g + 8 * r < M && g + 8 * r < MT;  // the launcher guarantees M <= MT; kept local
    x_src[r] = x + (row_ok[r] ? static_cast<int64_t>(g + 8 * r) * ldx + c_begin * kChunkK + 32 * t : 0);
  }
  int k_next = c_begin * kChunkK + 32 * t;  // first input feature of this lane's 32 in the next chunk
  int grp = k_next / group;                 // its group, tracked without dividing again
  int grp_rem = k_next - grp * group;

  const uint32_t ring_u32 = smem_u32(ring);
  const uint64_t weight_policy = l2_evict_first_policy();
  // Copy the next chunk into ring slot s.
  auto issue = [&](int s) {
    const uint32_t stage = ring_u32 + s * Cfg::kStageBytes;
    const int grp_clamped = min(grp, groups - 1);  // past K only inside the zero padding
#pragma unroll
    for (int i = 0; i < TN; ++i) {
      cp_async_cg16(stage + (i * 32 + lane) * 16, w_src[i], tile_ok[i] ? 16 : 0, weight_policy);
      cp_async_ca4(stage + Cfg::kWeightBytes + Cfg::kXBytes + (i * 32 + lane) * 4, s_src[i] + grp_clamped * kTileN,
                   tile_ok[i] ? 4 : 0);
      w_src[i] += w_step[i];
    }
    const int x_bytes = k_next < K ? 16 : 0;  // whole 32-feature runs: K % 32 == 0
#pragma unroll
    for (int r = 0; r < Cfg::kRowHalves; ++r) {
      if (row_ok[r]) {  // rows >= M: neither copied nor read (their A registers are zero)
#pragma unroll
        for (int q = 0; q < 4; ++q)
          cp_async_ca16(stage + Cfg::kWeightBytes + ((r * 4 + q) * Cfg::kXLanes + lane) * 16, x_src[r] + 8 * q,
                        x_bytes);
        x_src[r] += kChunkK;
      }
    }
    k_next += kChunkK;
    grp_rem += kChunkK;
    while (grp_rem >= group) {  // at most 4 steps (group >= 32)
      grp_rem -= group;
      ++grp;
    }
  };

  // MT = 16: acc[i] is the C fragment of tile i. MT = 8: acc[i] rows g and acc2[i] rows g + 8
  // both hold parts of activation row g (see the loop); acc2 is unused for MT = 16.
  float acc[TN][4], acc2[TN][4];
#pragma unroll
  for (int i = 0; i < TN; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = acc2[i][e] = 0.f;
  const uint32_t scale_sel = (g & 1) ? 0x3232u : 0x1010u;  // the lane's 16-bit scale in both halves

  // Prologue: STAGES chunks in flight (empty groups past the end keep the group count uniform).
#pragma unroll
  for (int s = 0; s < STAGES; ++s) {
    if (c_begin + s < c_end) issue(s);
    cp_async_commit();
  }

  int slot = 0;
  for (int c = c_begin; c < c_end; ++c) {
    // Groups committed so far: STAGES + (c - c_begin); chunk c's is complete once at most
    // STAGES - 1 remain in flight. Only this thread's copies are waited for, and only those are read.
    cp_async_wait<STAGES - 1>();
    uint4 w[TN];
    uint32_t s2[TN];
#pragma unroll
    for (int i = 0; i < TN; ++i) {
      w[i] = slot_w(slot)[i * 32 + lane];
      s2[i] = __byte_perm(slot_s(slot)[i * 32 + lane], 0u, scale_sel);
    }
#pragma unroll
    for (int wd = 0; wd < 4; ++wd) {  // word wd: codes j = 0..7 at 128c + 32t + 8wd + j, two mma
      // x0 / x1: words 0..3 = elements (0,1) (2,3) (4,5) (6,7) of x[g / g + 8, 128c + 32t + 8wd ..]
      const uint4 x0 = row_ok[0] ? slot_x(slot)[wd * Cfg::kXLanes + lane] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int i = 0; i < TN; ++i) {
        const uint32_t q = wd == 0 ? w[i].x : wd == 1 ? w[i].y : wd == 2 ? w[i].z : w[i].w;
        uint32_t b[4];  // weight pairs (j0,j1) (j2,j3) (j4,j5) (j6,j7)
        O::dequant(q, s2[i], b);
        if constexpr (MT == 16) {
          // A registers: (row g, kappa 2t..2t+1), (row g+8, same), (row g, kappa 2t+8..), (row g+8, same):
          // k-step 2wd takes elements (0,1) and (2,3), k-step 2wd + 1 elements (4,5) and (6,7).
          const uint4 x1 = row_ok[1] ? slot_x(slot)[(4 + wd) * Cfg::kXLanes + lane] : make_uint4(0u, 0u, 0u, 0u);
          const uint32_t a_even[4] = {x0.x, x1.x, x0.y, x1.y};
          const uint32_t a_odd[4] = {x0.z, x1.z, x0.w, x1.w};
          O::mma(acc[i], a_even, b[0], b[1]);
          O::mma(acc[i], a_odd, b[2], b[3]);
        } else {
          // MT = 1 or 8: only activation rows 0..7 exist, so the A tile's rows g + 8 may hold
          // anything: the loaded quad is used as is (no register shuffling). Its rows g see elements (0,1) and
          // (4,5), its rows g + 8 elements (2,3) and (6,7); the first mma takes the matching
          // weights into acc rows g, the second into acc2 rows g + 8, and the epilogue adds
          // acc rows g + acc2 rows g + 8 (the other halves are cross terms, discarded).
          const uint32_t a[4] = {x0.x, x0.y, x0.z, x0.w};
          O::mma(acc[i], a, b[0], b[2]);
          O::mma(acc2[i], a, b[1], b[3]);
        }
      }
    }
    // Refill the slot just read with chunk c + STAGES. The barrier-free ring relies on program
    // order within the thread; __syncwarp orders the shared-memory reads above before the copy.
    __syncwarp();
    if (c + STAGES < c_end) issue(slot);  // chunk c + STAGES
    cp_async_commit();
    slot = slot + 1 == STAGES ? 0 : slot + 1;
  }
  cp_async_wait<0>();

  // Sum the WARPS warps' partials of each tile; warp i writes tile i.
  // C fragment: c0, c1 = (row g, columns 2t, 2t+1), c2, c3 = (row g + 8, same columns).
#pragma unroll
  for (int i = 0; i < TN; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      partial[warp][i][e][lane] = MT == 16 ? acc[i][e] : e < 2 ? acc[i][e] + acc2[i][e + 2] : 0.f;
  __syncthreads();
  if (warp < TN && tile0 + warp < tiles) {
    const int i = warp;
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = 0.f;
#pragma unroll
      for (int ww = 0; ww < WARPS; ++ww) v[e] += partial[ww][i][e][lane];
    }
    const int n = (tile0 + i) * kTileN + 2 * t;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int m = g + 8 * (e >> 1), col = n + (e & 1);
      if (m < M && col < N) y[static_cast<int64_t>(m) * ldy + col] = O::from_float(v[e]);
    }
  }
#endif
}

// ---- dequantiser (dense path) -----------------------------------------------------------------

// One thread per packed word: 8 consecutive input features of one row, one 16-byte store.
template <ActDType D>
__global__ void w4_dequantize_kernel(const uint32_t* __restrict__ packed, const typename Ops<D>::T* __restrict__ scales,
                                     typename Ops<D>::T* __restrict__ weight, int N, int K, int group) {
  using O = Ops<D>;
  using T = typename O::T;
  const int tiles = (N + kTileN - 1) / kTileN, chunks = (K + kChunkK - 1) / kChunkK, groups = K / group;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(tiles) * chunks * 128) return;
  const int wd = static_cast<int>(i & 3), lane = static_cast<int>((i >> 2) & 31);
  const int64_t tile_chunk = i >> 7;
  const int c = static_cast<int>(tile_chunk % chunks), nt = static_cast<int>(tile_chunk / chunks);
  const int n = nt * kTileN + (lane >> 2), k0 = c * kChunkK + 32 * (lane & 3) + 8 * wd;
  if (n >= N || k0 >= K) return;  // padding
  const float s = O::to_float(scales[(static_cast<int64_t>(nt) * groups + k0 / group) * kTileN + (lane >> 2)]);
  const uint32_t q = packed[i];
  alignas(16) T out[8];
#pragma unroll
  for (int p = 0; p < 8; ++p)
    out[O::nibble_j(p)] = O::from_float(static_cast<float>(static_cast<int>((q >> (4 * p)) & 15u) - 8) * s);
  *reinterpret_cast<uint4*>(weight + static_cast<int64_t>(n) * K + k0) = *reinterpret_cast<const uint4*>(out);
}

// ---- launchers --------------------------------------------------------------------------------

// A device's compute-capability major, looked up once per device (the lookup costs a driver call
// per launch otherwise; devices past the cache are looked up every time).
cudaError_t device_major(int device, int* major) {
  static std::atomic<int> cache[kDeviceCache];  // major + 1; 0 = not looked up yet
  if (device >= 0 && device < kDeviceCache) {
    const int known = cache[device].load(std::memory_order_relaxed);
    if (known > 0) {
      *major = known - 1;
      return cudaSuccess;
    }
  }
  const cudaError_t err = cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess && device >= 0 && device < kDeviceCache)
    cache[device].store(*major + 1, std::memory_order_relaxed);
  return err;
}

template <ActDType D, int MT, int TN, int STAGES, int WARPS>
cudaError_t launch_mma(int device, const void* x, int64_t ldx, const int32_t* packed, const void* scales, void* y,
                       int64_t ldy, int64_t M, int64_t N, int64_t K, int64_t group, cudaStream_t stream) {
  using T = typename Ops<D>::T;
  using Cfg = MmaConfig<MT, TN, STAGES, WARPS>;
  auto* kernel = &w4a16_mma_kernel<D, MT, TN, STAGES, WARPS>;
  // Above 48 KiB of dynamic shared memory needs an opt-in, per device and function: set once per
  // device (bit d of `configured`); a race sets it twice, which is harmless.
  static std::atomic<uint32_t> configured{0};
  const uint32_t bit = device >= 0 && device < 32 ? 1u << device : 0u;
  if (bit == 0 || !(configured.load(std::memory_order_relaxed) & bit)) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (err != cudaSuccess) return err;
    configured.fetch_or(bit, std::memory_order_relaxed);
  }
  const int64_t tiles = (N + kTileN - 1) / kTileN;
  const dim3 grid(static_cast<unsigned>((tiles + TN - 1) / TN));
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(
      static_cast<const T*>(x), ldx, reinterpret_cast<const uint4*>(packed), static_cast<const T*>(scales),
      static_cast<T*>(y), ldy, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), static_cast<int>(group));
  return cudaGetLastError();
}

// The launch configurations one build carries. Entries 0 and 1 are the automatic choice (measured
// on an H200 with every CUDA test passing); the others exist for tuning sweeps
// (bench/bench_quant.py --tune, run by bench/gpu_check.sh), whose results decide what the
// automatic choice should become. Shared memory per block: WARPS x STAGES x (TN x 640 + x bytes)
// with x bytes 256 (rows 1), 2048 (8), 4096 (16), plus the WARPS x TN x 512 B partial sums.
//   rows 8, TN 2, 5 stages, 4 warps: 69 KiB, 3 blocks per H200 SM; rows 1, same: 34 KiB, 6 blocks.
constexpr W4MmaTuning kTunings[] = {
    {8, 2, 5, 4},   // 0: automatic for M <= 8
    {16, 2, 4, 4},  // 1: automatic for 8 < M <= 16
    {1, 2, 5, 4},   // 2-8: M = 1 only (x ring for row 0 only: more blocks per SM)
    {1, 2, 8, 4},
    {1, 1, 8, 4},
    {1, 4, 4, 4},
    {1, 4, 8, 4},
    {1, 2, 6, 8},
    {1, 4, 6, 8},
    {8, 2, 8, 4},   // 9-10: M <= 8
    {8, 4, 4, 4},
    {16, 2, 5, 4},  // 11: M <= 16
};
constexpr int kNumTunings = static_cast<int>(sizeof(kTunings) / sizeof(kTunings[0]));

template <ActDType D, int I>
cudaError_t launch_tuning(int device, const void* x, int64_t ldx, const int32_t* packed, const void* scales, void* y,
                          int64_t ldy, int64_t M, int64_t N, int64_t K, int64_t group, cudaStream_t stream) {
  constexpr W4MmaTuning t = kTunings[I];
  return launch_mma<D, t.rows, t.tiles_n, t.stages, t.warps>(device, x, ldx, packed, scales, y, ldy, M, N, K, group,
                                                             stream);
}

// Launches table entry `index` (every entry is instantiated once per dtype).
template <ActDType D, int... I>
cudaError_t launch_indexed(int index, int device, const void* x, int64_t ldx, const int32_t* packed,
                           const void* scales, void* y, int64_t ldy, int64_t M, int64_t N, int64_t K, int64_t group,
                           cudaStream_t stream, std::integer_sequence<int, I...>) {
  cudaError_t err = cudaErrorInvalidValue;
  (void)((index == I && ((err = launch_tuning<D, I>(device, x, ldx, packed, scales, y, ldy, M, N, K, group,
                                                     stream)),
                         true)) ||
         ...);
  return err;
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

int w4a16_mma_tuning_count() { return kNumTunings; }

W4MmaTuning w4a16_mma_tuning(int index) {
  return index >= 0 && index < kNumTunings ? kTunings[index] : W4MmaTuning{0, 0, 0, 0};
}

int w4a16_mma_auto_tuning(int64_t M) { return M <= 8 ? 0 : 1; }

cudaError_t launch_w4a16_mma(const void* x, int64_t ldx, const int32_t* packed, const void* scales, void* y,
                             int64_t ldy, int64_t M, int64_t N, int64_t K, int64_t group, ActDType dtype,
                             cudaStream_t stream, int tuning) {
  if (tuning < 0) tuning = w4a16_mma_auto_tuning(M);
  if (tuning >= kNumTunings || M < 1 || M > kTunings[tuning].rows || N < 1 || K < 32 || K % 32 != 0 || group < 32 ||
      group % 32 != 0 || K % group != 0 || N > (int64_t{1} << 30) || K > (int64_t{1} << 30) || ldx < K ||
      ldx % 8 != 0 || ldy < N || !aligned(x, 16) || !aligned(packed, 16) || !aligned(scales, 4))
    return cudaErrorInvalidValue;
  int device = 0, major = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = device_major(device, &major);
  if (err != cudaSuccess) return err;
  if (major < 8) return cudaErrorNotSupported;  // mma.m16n8k16.bf16 / cp.async: sm_80 and newer
  const auto all = std::make_integer_sequence<int, kNumTunings>{};
  return dtype == ActDType::kFloat16
             ? launch_indexed<ActDType::kFloat16>(tuning, device, x, ldx, packed, scales, y, ldy, M, N, K, group,
                                                  stream, all)
             : launch_indexed<ActDType::kBFloat16>(tuning, device, x, ldx, packed, scales, y, ldy, M, N, K, group,
                                                   stream, all);
}

cudaError_t launch_w4_dequantize(const int32_t* packed, const void* scales, void* weight, int64_t N, int64_t K,
                                 int64_t group, ActDType dtype, cudaStream_t stream) {
  if (N < 0 || K < 32 || K % 32 != 0 || group < 32 || group % 32 != 0 || K % group != 0 ||
      N > (int64_t{1} << 30) || K > (int64_t{1} << 30) || !aligned(weight, 16))
    return cudaErrorInvalidValue;
  const int64_t words = (N + kTileN - 1) / kTileN * ((K + kChunkK - 1) / kChunkK) * 128;
  if (words == 0) return cudaSuccess;
  const int threads = 256;
  const dim3 grid(static_cast<unsigned>((words + threads - 1) / threads));
  const auto* p = reinterpret_cast<const uint32_t*>(packed);
  if (dtype == ActDType::kFloat16)
    w4_dequantize_kernel<ActDType::kFloat16><<<grid, threads, 0, stream>>>(
        p, static_cast<const __half*>(scales), static_cast<__half*>(weight), static_cast<int>(N), static_cast<int>(K),
        static_cast<int>(group));
  else
    w4_dequantize_kernel<ActDType::kBFloat16><<<grid, threads, 0, stream>>>(
        p, static_cast<const __nv_bfloat16*>(scales), static_cast<__nv_bfloat16*>(weight), static_cast<int>(N),
        static_cast<int>(K), static_cast<int>(group));
  return cudaGetLastError();
}

}  // namespace specdec::quant
