// Per-row status codes that kernels write instead of raising (no host synchronisation inside a
// kernel). The Python layer maps them to messages (specdec_cuda.ops.status).
#pragma once

#include <cstdint>

namespace specdec {

enum RowStatus : int32_t {
  kStatusOk = 0,
  // A logit row of this request held NaN or +inf, or every logit was -inf: no distribution.
  kStatusNonFiniteLogits = 1,
  // A draft token id was outside [0, vocab).
  kStatusDraftTokenOutOfRange = 2,
  // temperature < 0 or NaN, or top_p outside (0, 1].
  kStatusBadSamplingParams = 3,
  // A tree row failed validation (parent index not smaller than the node's own index, ...).
  kStatusMalformedTree = 4,
};

}  // namespace specdec
