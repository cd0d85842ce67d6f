// Counter-based Philox4x32-10 random numbers, keyed the way DESIGN.md prescribes.
//
// Every random number in the project is a pure function of
//     (request seed, absolute token position, purpose, substream, element index)
// so a row's draws depend neither on its batch neighbours nor on its place in the batch, CPU and
// CUDA produce the same bits, and tensor-parallel ranks agree without talking.
//
// Layout of one Philox call (4 x 32-bit outputs):
//   key     = (seed & 0xffffffff, seed >> 32)
//   counter = (element / 4, purpose | substream << 8, position & 0xffffffff, position >> 32)
//   output  = lane element % 4
// python/specdec_cuda/reference/philox.py implements the identical function in plain PyTorch.
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"

namespace specdec {

// What a draw is for. Distinct purposes give independent streams at the same position.
enum Purpose : uint32_t {
  kPurposeAccept = 1,    // the uniform of an accept / reject test
  kPurposeResidual = 2,  // sampling from the residual max(0, p - q) after a rejection
  kPurposeSample = 3,    // sampling from the target: bonus token, sample-and-match, plain sampling
  kPurposeDraft = 4,     // sampling draft tokens from a drafter's distribution
  kPurposeTree = 5,      // reserved for tree verification (one-hot sibling walks)
  kPurposeDiffusion = 6, // diffusion generation: drawing a masked position's token (substream = step)
};

struct PhiloxOut {
  uint32_t x[4];
};

SPECDEC_HD void mulhilo32(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t prod = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(prod >> 32);
  lo = static_cast<uint32_t>(prod);
}

// Philox4x32 with 10 rounds (Salmon et al., SC'11); constants from the paper.
SPECDEC_HD PhiloxOut philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                   uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#if defined(__CUDACC__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo32(kM0, c0, hi0, lo0);
    mulhilo32(kM1, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  PhiloxOut out;
  out.x[0] = c0;
  out.x[1] = c1;
  out.x[2] = c2;
  out.x[3] = c3;
  return out;
}

// The stream of one (seed, position, purpose, substream); element() gives the i-th 32-bit draw.
struct RandomStream {
  uint32_t k0, k1;      // seed
  uint32_t c1;          // purpose | substream << 8
  uint32_t c2, c3;      // absolute position

  SPECDEC_HD RandomStream(uint64_t seed, int64_t position, uint32_t purpose, uint32_t substream) {
    k0 = static_cast<uint32_t>(seed);
    k1 = static_cast<uint32_t>(seed >> 32);
    c1 = (purpose & 0xffu) | (substream << 8);
    const uint64_t pos = static_cast<uint64_t>(position);
    c2 = static_cast<uint32_t>(pos);
    c3 = static_cast<uint32_t>(pos >> 32);
  }

  // Four consecutive draws, elements 4*block .. 4*block+3.
  SPECDEC_HD PhiloxOut block(uint32_t block_index) const {
    return philox4x32_10(block_index, c1, c2, c3, k0, k1);
  }

  SPECDEC_HD uint32_t element(uint32_t index) const { return block(index >> 2).x[index & 3u]; }
};

// Uniform in the open interval (0, 1), exactly representable in float32:
// (2 * (bits >> 9) + 1) * 2^-24, i.e. one of 2^23 odd multiples of 2^-24. Never 0 and never 1,
// so strict comparisons `u * q < p` can never accept a token of zero target probability, and
// -log(u) and -log(-log(u)) are always finite.
SPECDEC_HD float uniform_open01(uint32_t bits) {
  return static_cast<float>(bits >> 9) * 1.1920928955078125e-07f /* 2^-23 */ +
         5.9604644775390625e-08f /* 2^-24 */;
}

}  // namespace specdec
