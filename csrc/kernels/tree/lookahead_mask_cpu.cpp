// CPU kernel of lookahead_mask: one batch row per call (the glue spreads rows over threads). The
// rules are those of lookahead_mask.h, shared with the CUDA kernel.
#include <cstddef>
#include <vector>

#include "kernels/common/status.h"
#include "kernels/tree/lookahead_mask.h"

namespace specdec {
namespace tree {

void lookahead_mask_row_cpu(const LookaheadMaskArgs& a, int64_t b) {
  const LookaheadShape& s = a.shape;
  const int64_t t = lookahead_width(s);
  const int64_t* lens = a.guess_lens + b * s.num_guesses;
  const int64_t cache_len = a.cache_len[b];
  const bool ok = lookahead_row_ok(s, lens, cache_len);
  a.status[b] = ok ? kStatusOk : kStatusMalformedTree;
  // A flagged row is laid out as if no guess had a token, at position 0 (nothing can overflow).
  std::vector<int64_t> zeros(static_cast<size_t>(s.num_guesses), 0);
  const int64_t* used = ok ? lens : zeros.data();
  const int64_t base = ok ? cache_len : 0;
  for (int64_t v = 0; v < t; ++v) {
    a.positions[b * t + v] = base + lookahead_offset(s, used, v);
    uint8_t* row = a.tree_mask + (b * t + v) * t;
    for (int64_t u = 0; u < t; ++u) row[u] = lookahead_visible(s, used, v, u) ? 1 : 0;
  }
}

}  // namespace tree
}  // namespace specdec
