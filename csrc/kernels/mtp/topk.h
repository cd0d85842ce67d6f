// A running top-k list, written once for the CPU and CUDA MTP-head kernels.
//
// Order: larger value first; equal values by the lower vocabulary index (torch.argmax's tie rule,
// so the rank-0 candidate is exactly the argmax). A list holds `n <= k` entries, sorted.
#pragma once

#include <cstdint>

#include "kernels/common/hd.h"

namespace specdec::mtp {

template <typename Acc>
SPECDEC_HD bool ranks_before(Acc v, int64_t i, Acc w, int64_t j) {
  return v > w || (v == w && i < j);
}

// Insert (v, i) into vals/idx [k] holding n sorted entries; drops the last one when full.
template <typename Acc>
SPECDEC_HD void topk_insert(Acc* vals, int64_t* idx, int k, int& n, Acc v, int64_t i) {
  if (n == k) {
    if (!ranks_before(v, i, vals[k - 1], idx[k - 1])) return;
  } else {
    ++n;
  }
  int p = n - 1;
  while (p > 0 && ranks_before(v, i, vals[p - 1], idx[p - 1])) {
    vals[p] = vals[p - 1];
    idx[p] = idx[p - 1];
    --p;
  }
  vals[p] = v;
  idx[p] = i;
}

}  // namespace specdec::mtp
