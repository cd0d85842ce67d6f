// Validation of one row of a compact_kv request, shared by the CPU and CUDA kernels.
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"
#include "kernels/common/status.h"
#include "kernels/tree/tree.h"

namespace specdec {
namespace tree {

// Writes status[b] (kStatusOk, or kStatusBadCompaction) and returns whether row b moves data. A row whose path starts
// with -1 (flagged by verify_tree) is valid and moves nothing.
SPECDEC_HD bool compact_row_ok(const CompactArgs& a, int64_t b) {
  const int64_t* path = a.accepted_nodes + b * a.width;
  if (a.width < 1 || path[0] < 0) {
    a.status[b] = kStatusOk;
    return false;
  }
  a.status[b] = kStatusBadCompaction;
  // Each operand's range first (num_accepted < width, 0 <= dst <= src < slots), then the sums
  // compared as differences, so an entry near INT64_MAX cannot overflow a check into passing.
  const int64_t na = a.num_accepted[b], src = a.src_start[b], dst = a.dst_start[b];
  if (na < 0 || na >= a.width || dst < 0 || dst > src || src >= a.slots) return false;
  const int64_t len = na + 1;
  for (int64_t j = 1; j < len; ++j)
    if (path[j] <= path[j - 1]) return false;
  // Strictly increasing from path[0] >= 0 gives path[j] >= j; with dst <= src every destination
  // dst + j <= src + path[j], so a copy in increasing j never overwrites a slot still to be read
  // (and a slot written at step j is never the source of a later step).
  if (path[len - 1] > a.slots - 1 - src || len - 1 > a.slots - 1 - dst) return false;
  a.status[b] = kStatusOk;
  return true;
}

}  // namespace tree
}  // namespace specdec
