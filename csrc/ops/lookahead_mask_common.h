// Argument checks and packing of lookahead_mask, shared by tree_cpu.cpp and tree_cuda.cpp.
#pragma once

#include "ops/aten.h"

#include "kernels/tree/lookahead_mask.h"
#include "ops/tree_common.h"

namespace specdec {
namespace tree_ops {

// The CUDA kernel stages a row's guess lengths in shared memory (lookahead_mask_cuda.cu).
constexpr int64_t kMaxLookaheadGuesses = 256;

inline tree::LookaheadMaskArgs lookahead_mask_args(const at::Tensor& cache_len,
                                                   const at::Tensor& guess_lens, int64_t guess_len,
                                                   int64_t window, int64_t levels,
                                                   at::Tensor& positions, at::Tensor& tree_mask,
                                                   at::Tensor& status) {
  const auto dev = cache_len.device();
  TORCH_CHECK(cache_len.dim() == 1, "cache_len: expected shape (B,), got ", cache_len.sizes());
  const int64_t batch = cache_len.size(0);
  check_vec(cache_len, "cache_len", at::kLong, batch, dev);  // (B,)
  // guess_lens: (B, G)
  TORCH_CHECK(guess_lens.dim() == 2 && guess_lens.size(0) == batch,
              "guess_lens: expected shape (B, G) with B = ", batch, ", got ", guess_lens.sizes());
  const int64_t num_guesses = guess_lens.size(1);
  check_out(guess_lens, "guess_lens", at::kLong, {batch, num_guesses}, dev);
  TORCH_CHECK(num_guesses <= kMaxLookaheadGuesses, "guess_lens: at most ",
              kMaxLookaheadGuesses, " guesses per row, got ", num_guesses);
  TORCH_CHECK(guess_len >= 0 && guess_len <= 4096, "guess_len: must lie in [0, 4096], got ",
              guess_len);
  TORCH_CHECK(window >= 0 && window <= 4096, "window: must lie in [0, 4096], got ", window);
  TORCH_CHECK(levels >= 0 && levels <= 64, "levels: must lie in [0, 64], got ", levels);
  tree::LookaheadShape shape{num_guesses, guess_len, window, levels};
  const int64_t t = tree::lookahead_width(shape);
  check_out(positions, "positions", at::kLong, {batch, t}, dev);      // (B, T)
  check_out(tree_mask, "tree_mask", at::kBool, {batch, t, t}, dev);   // (B, T, T)
  check_out(status, "status", at::kInt, {batch}, dev);                // (B,)
  tree::LookaheadMaskArgs a{};
  a.shape = shape;
  a.cache_len = cache_len.data_ptr<int64_t>();
  a.guess_lens = guess_lens.data_ptr<int64_t>();
  a.batch = batch;
  a.positions = positions.data_ptr<int64_t>();
  a.tree_mask = reinterpret_cast<uint8_t*>(tree_mask.data_ptr<bool>());
  a.status = status.data_ptr<int32_t>();
  return a;
}

}  // namespace tree_ops
}  // namespace specdec
