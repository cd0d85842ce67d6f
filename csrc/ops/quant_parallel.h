// Splitting a range of independent work items (weight tiles, cache rows) over torch's intra-op
// threads. setup.py compiles the glue with -fopenmp, so at::parallel_for (header-inline over
// OpenMP, torch's own backend) really runs in parallel; the check below keeps it that way.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>

#ifndef INTRA_OP_PARALLEL
#error "compile the glue with -fopenmp (setup.py does): at::parallel_for would otherwise run serially"
#endif

namespace specdec::ops {

// Callers pick `grain` so that a chunk is worth a thread (tens of microseconds of work).
template <typename F>
void parallel_range(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
  at::parallel_for(begin, end, grain, f);
}

}  // namespace specdec::ops
