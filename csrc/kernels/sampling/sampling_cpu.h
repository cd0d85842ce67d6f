// CPU kernels of the sampling family (torch-free). Each entry point handles a range of rows (or
// target rows) so the glue can spread the work with at::parallel_for; every row is independent.
#pragma once

#include <cstdint>

#include "kernels/sampling/chain.h"

namespace specdec {
namespace sampling {

// sample: rows [begin, end) of `a`.
void sample_cpu(const SampleArgs& a, int64_t begin, int64_t end);

// verify_chain, serial strategy: rows [begin, end), each walked position by position and stopped
// at the first rejection (a rejected tail is never read).
void verify_chain_serial_cpu(const VerifyArgs& a, int64_t begin, int64_t end);

// verify_chain, parallel strategy, step 1: every position of every row at once. row_of_target[t]
// is the row owning target logit row t; results[t] receives the decision of that position.
void verify_chain_positions_cpu(const VerifyArgs& a, const int64_t* row_of_target, int64_t begin,
                                int64_t end, PositionResult* results);

// verify_chain, parallel strategy, step 2: walk rows [begin, end) over the results of step 1.
void verify_chain_walk_cpu(const VerifyArgs& a, const PositionResult* results, int64_t begin,
                           int64_t end);

}  // namespace sampling
}  // namespace specdec
