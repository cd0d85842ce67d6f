// The one table of per-row status codes. Kernels write these instead of raising (no host
// synchronisation inside a kernel); every op family uses this table and no other number.
// Python mirror: python/specdec_cuda/ops/status.py (describe / raise_for), held equal to this file
// by tests/test_status.py. A new code goes here, there, and in the test's expected table.
#pragma once

#include <cstdint>

namespace specdec {

enum RowStatus : int32_t {
  kStatusOk = 0,
  // sample / verify_chain / verify_tree: a logit row this request read held NaN or +inf (after the
  // temperature), or every logit was -inf: no distribution. ddtree_build: NaN or +inf among the
  // row's top-K log-probabilities (the row gets no nodes).
  kStatusNonFiniteLogits = 1,
  // verify_chain / verify_tree: a draft token id outside [0, vocab), or (verify_chain) the row's
  // cu_num_draft entries are unusable. mtp_input (CUDA): a token id outside [0, vocab).
  kStatusDraftTokenOutOfRange = 2,
  // sample / verify_chain / verify_tree: temperature < 0 or NaN, or top_p outside (0, 1].
  kStatusBadSamplingParams = 3,
  // build_tree / verify_tree: a tree row failed validation (a parent not below its node, a root
  // parent other than -1, an empty row or one longer than max_nodes; build_tree with an hf_mask:
  // cache_len outside [0, max_prefix]); lookahead_mask: a guess length outside [0, guess_len] or
  // cache_len < 0.
  kStatusMalformedTree = 4,
  // compact_kv: the row's request is not a valid compaction (path not increasing, num_accepted
  // outside the path's width, dst_start > src_start or a slot outside the cache); nothing moved.
  kStatusBadCompaction = 5,
};

}  // namespace specdec
