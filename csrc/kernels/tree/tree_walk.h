// Tree validation and walks shared by the CPU and CUDA tree kernels.
//
// Layout (python/specdec_cuda/reference/tree.py): row b owns nodes cu[b] .. cu[b+1]-1 of the flat
// arrays; `parents` holds row-local indices, node 0 is the root with parent -1, every other node v
// has 0 <= parents[v] < v. That single rule bounds every walk: following parents from v strictly
// decreases the index, so a walk takes at most v steps, and depth <= n - 1.
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"

namespace specdec {
namespace tree {

// Whether the row [lo, hi) of the flat arrays (total length num_flat) is a usable row of at most
// max_nodes nodes. Checked before any node of it is read.
SPECDEC_HD bool row_bounds_ok(int64_t lo, int64_t hi, int64_t num_flat, int64_t max_nodes) {
  return lo >= 0 && hi > lo && hi <= num_flat && hi - lo <= max_nodes;
}

// Whether a row's cache_len is usable: >= 0, small enough that cache_len + depth (< max_nodes)
// cannot overflow, and with the Hugging Face mask inside [0, max_prefix].
SPECDEC_HD bool cache_len_ok(int64_t cache_len, int64_t max_nodes, bool hf_mask, int64_t max_prefix) {
  if (cache_len < 0 || cache_len > INT64_MAX - max_nodes) return false;
  return !hf_mask || cache_len <= max_prefix;
}

// Whether node v of a row (parents = the row's parent array) satisfies the tree rule.
SPECDEC_HD bool node_ok(const int64_t* parents, int64_t v) {
  const int64_t p = parents[v];
  return v == 0 ? p == -1 : (p >= 0 && p < v);
}

// Depth of node v of a validated row: the number of parent steps to the root.
SPECDEC_HD int64_t node_depth(const int64_t* parents, int64_t v) {
  int64_t depth = 0;
  for (int64_t u = v; u > 0; u = parents[u]) ++depth;  // parents[u] < u: at most v steps
  return depth;
}

// Sets bit u of `bits` (one mask row, little-endian words) for every ancestor u of v and v itself.
SPECDEC_HD void ancestor_bits(const int64_t* parents, int64_t v, uint32_t* bits) {
  for (int64_t u = v; u >= 0; u = parents[u]) {
    bits[u >> 5] |= 1u << (u & 31);
    if (u == 0) break;
  }
}

// The first child of v with index > after (-1 when none); children of v are the nodes c > v with
// parents[c] == v. Used to enumerate children in index order without an explicit child list.
SPECDEC_HD int64_t next_child(const int64_t* parents, int64_t n, int64_t v, int64_t after) {
  const int64_t start = after < v ? v + 1 : after + 1;
  for (int64_t c = start; c < n; ++c)
    if (parents[c] == v) return c;
  return -1;
}

// The next sibling of c (> c, same parent), -1 when none.
SPECDEC_HD int64_t next_sibling(const int64_t* parents, int64_t n, int64_t c) {
  if (c == 0) return -1;
  return next_child(parents, n, parents[c], c);
}

}  // namespace tree
}  // namespace specdec
