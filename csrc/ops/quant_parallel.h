// Splitting a range of independent work items (weight tiles, cache rows) over torch's threads.
//
// at::parallel_for is used when ATen's intra-op backend is compiled into this translation unit.
// This extension is built without -fopenmp (setup.py passes only -fopenmp-simd), and torch's
// OpenMP backend is header-inline, so there at::parallel_for would run the whole range on the
// calling thread; the fallback then fans the range out over torch's inter-op pool (at::launch),
// at most at::get_num_threads() chunks, and runs the first chunk itself.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>

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
  std::mutex mu;
  std::condition_variable done_cv;
  int64_t pending = chunks - 1;
  std::exception_ptr error;
  for (int64_t c = 1; c < chunks; ++c) {
    const int64_t b = begin + c * per, e = std::min(end, b + per);
    at::launch([&, b, e] {
      std::exception_ptr local;
      try {
        f(b, e);
      } catch (...) {
        local = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu);
      if (local && !error) error = local;
      if (--pending == 0) done_cv.notify_one();
    });
  }
  std::exception_ptr mine;
  try {
    f(begin, std::min(end, begin + per));
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu);
  done_cv.wait(lock, [&] { return pending == 0; });
  if (mine) std::rethrow_exception(mine);
  if (error) std::rethrow_exception(error);
#endif
}

}  // namespace specdec::ops
