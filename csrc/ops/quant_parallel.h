// Splitting a range of independent work items (weight tiles, cache rows) over torch's threads.
//
// at::parallel_for is used when ATen's intra-op backend is compiled into this translation unit.
// This extension is built without -fopenmp (setup.py passes only -fopenmp-simd), and torch's
// OpenMP backend is header-inline, so there at::parallel_for would run the whole range on the
// calling thread; the fallback then runs at most at::get_num_threads() chunks on short-lived
// std::threads, the first on the calling thread. (Not torch's inter-op pool: a caller that is
// itself an inter-op task would wait on tasks queued behind it.) Callers pick `grain` so that a
// chunk is worth a thread start (tens of microseconds).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace specdec::ops {

template <typename F>
void parallel_range(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
#ifdef INTRA_OP_PARALLEL
  at::parallel_for(begin, end, grain, f);
#else
  const int64_t items = end - begin;
  int64_t chunks = std::min<int64_t>(at::get_num_threads(), (items + grain - 1) / grain);
  if (chunks <= 1 || at::in_parallel_region()) {
    f(begin, end);
    return;
  }
  const int64_t per = (items + chunks - 1) / chunks;
  chunks = (items + per - 1) / per;
  std::vector<std::exception_ptr> errors(chunks);
  std::vector<std::thread> workers;
  workers.reserve(chunks - 1);
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t b = begin + c * per, e = std::min(end, b + per);
    workers.emplace_back([&f, &errors, c, b, e] {
      try {
        f(b, e);
      } catch (...) {
        errors[c] = std::current_exception();
      }
    });
  }
  try {
    f(begin, std::min(end, begin + per));
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& w : workers) w.join();
  for (const auto& err : errors)
    if (err) std::rethrow_exception(err);
#endif
}

}  // namespace specdec::ops
