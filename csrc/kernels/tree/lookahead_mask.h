// Lookahead decoding's step layout (Fu et al. 2024): which token of one verification forward sees
// which, and where each sits. Torch-free; the per-element rules are SPECDEC_HD so the CPU loop and
// the CUDA kernel compute the same bits.
//
// One row's T = 1 + G * K + W * L slots, in this order:
//
//   slot 0                      the root: the newest committed token, at position cache_len
//   1 + g * K + i               guess g (0 <= g < G), token i (0 <= i < K): real when
//                               i < guess_lens[g], at cache_len + 1 + i; it sees the root and
//                               tokens 0 .. i of its own guess (a chain hanging off the root)
//   1 + G * K + l * W + j       the Jacobi window, level l (0 <= l < L), column j (0 <= j < W),
//                               at cache_len + 1 + l + j; it sees the root, level 0's columns
//                               0 .. j, and its own column's levels 1 .. l (its trajectory)
//
// For W = 3, L = 2 (window slots only; r = root, a/b = levels 0/1, x = sees):
//
//          r a0 a1 a2 b0 b1 b2        position (root + ...)
//     a0   x  x                       1
//     a1   x  x  x                    2
//     a2   x  x  x  x                 3
//     b0   x  x        x              2
//     b1   x  x  x        x           3
//     b2   x  x  x  x        x        4
//
// so each window token reads one chain of consecutive positions: root, level 0 up to its column,
// then up its column; its logits guess the token one position further, the next level of its column.
// Padded guess slots (i >= guess_lens[g]) see only themselves and sit at cache_len, as build_tree
// pads. Every slot sees itself, so no softmax row is empty. The cached prefix is always visible and
// is not part of these masks.
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"

namespace specdec {
namespace tree {

struct LookaheadShape {
  int64_t num_guesses;  // G
  int64_t guess_len;    // K, the most tokens per guess (N - 1 in the paper)
  int64_t window;       // W, columns of the Jacobi window
  int64_t levels;       // L, levels of the window (N - 1 in the paper)
};

SPECDEC_HD int64_t lookahead_width(const LookaheadShape& s) {
  return 1 + s.num_guesses * s.guess_len + s.window * s.levels;
}

// Whether a row's inputs are usable: every guess length in [0, K], cache_len >= 0 and small enough
// that cache_len + (the largest offset, < T) cannot overflow. lens: the row's (G,) guess lengths.
SPECDEC_HD bool lookahead_row_ok(const LookaheadShape& s, const int64_t* lens, int64_t cache_len) {
  if (cache_len < 0 || cache_len > INT64_MAX - lookahead_width(s)) return false;
  for (int64_t g = 0; g < s.num_guesses; ++g)
    if (lens[g] < 0 || lens[g] > s.guess_len) return false;
  return true;
}

// Position of slot v relative to the root (cache_len). lens: the row's guess lengths, already
// validated (a flagged row passes all-zero lengths).
SPECDEC_HD int64_t lookahead_offset(const LookaheadShape& s, const int64_t* lens, int64_t v) {
  const int64_t guesses_end = 1 + s.num_guesses * s.guess_len;
  if (v == 0) return 0;
  if (v < guesses_end) {
    const int64_t g = (v - 1) / s.guess_len, i = (v - 1) % s.guess_len;
    return i < lens[g] ? 1 + i : 0;
  }
  const int64_t w = v - guesses_end;
  return 1 + w / s.window + w % s.window;  // 1 + level + column
}

// Whether slot v (the query) sees slot u (the key).
SPECDEC_HD bool lookahead_visible(const LookaheadShape& s, const int64_t* lens, int64_t v, int64_t u) {
  if (u == v) return true;
  if (v == 0) return false;
  const int64_t guesses_end = 1 + s.num_guesses * s.guess_len;
  if (v < guesses_end) {
    const int64_t g = (v - 1) / s.guess_len, i = (v - 1) % s.guess_len;
    if (i >= lens[g]) return false;  // padding
    if (u == 0) return true;
    // Earlier tokens of the same guess: same g, smaller i (u < v excludes later ones).
    return u < v && u >= 1 + g * s.guess_len;
  }
  if (u == 0) return true;
  if (u < guesses_end) return false;  // the window never sees a guess
  const int64_t wv = v - guesses_end, wu = u - guesses_end;
  const int64_t lv = wv / s.window, jv = wv % s.window;
  const int64_t lu = wu / s.window, ju = wu % s.window;
  if (lu == 0) return ju <= jv;            // level 0 up to the query's column
  return ju == jv && lu <= lv;             // its own column, levels 1 .. l
}

struct LookaheadMaskArgs {
  LookaheadShape shape;
  const int64_t* cache_len;   // (B,) the root's position per row
  const int64_t* guess_lens;  // (B, G) tokens per guess, each in [0, K]
  int64_t batch;
  int64_t* positions;         // (B, T) absolute positions
  uint8_t* tree_mask;         // (B, T, T) bool, [b, v, u]: slot v sees slot u
  int32_t* status;            // (B,) kStatusMalformedTree for a bad guess length or cache_len
};

// CPU: row b. CUDA: the whole batch on a stream, returning a cudaError_t as int.
void lookahead_mask_row_cpu(const LookaheadMaskArgs& a, int64_t b);
int lookahead_mask_cuda(const LookaheadMaskArgs& a, void* stream);

}  // namespace tree
}  // namespace specdec
