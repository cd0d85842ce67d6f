// Splitting a range of independent work items over torch's intra-op thread count, where the
// calling thread never waits for a helper that has not started: claim_parallel_range.
//
// Why not at::parallel_for here: an OpenMP region ends at a barrier, so it waits for every thread
// of the team, also one the OS has not scheduled. On a 2-core machine shared with other work
// (measured: two compilers at nice 5) every region then costs ~8 ms, torch's own elementwise ops
// included, and a decoding step of a 28-layer model runs ~140 of them (each projection, the
// attention, the LM head): 2 threads ran 3.5x slower than 1. Here the range is cut into chunks
// that threads claim from one atomic counter; the caller claims chunks too and, when none are
// left, waits only for chunks a helper has claimed and not finished. A helper the OS has not
// scheduled claims nothing and costs nothing; one that runs takes half the work.
//
//   caller:  publish job ─ claim, run, claim, run, ... none left ─ wait for claimed chunks ─ return
//   helper:  (spinning ~0.1 ms after its last job, else asleep on a condition variable)
//            sees the job ─ claim, run, ... none left ─ spin, then sleep
//
// The state word packs (generation, chunk count, next chunk); a claim is a compare-exchange that
// fails once the generation moved on, so a late helper never runs a finished job's chunks, and the
// job's function stays valid while any of its chunks runs (the caller waits for them). Each chunk
// is run by exactly one thread, whole: results do not depend on the thread count or on who ran
// what. Nested calls (from a helper, an OpenMP region, or a second calling thread while one job
// runs) run serially in the caller.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define SPECDEC_PAUSE() _mm_pause()
#else
#define SPECDEC_PAUSE() std::this_thread::yield()
#endif

namespace specdec::ops {

class ClaimPool {
 public:
  // One pool per process, never destroyed (helpers are detached: no join at exit).
  static ClaimPool& instance() {
    static ClaimPool* pool = new ClaimPool();
    return *pool;
  }

  // f(chunk_begin, chunk_end) over [begin, end) in chunks of `grain` items, on up to `threads`
  // threads (this one included).
  template <typename F>
  void run(int64_t begin, int64_t end, int64_t grain, int threads, const F& f) {
    const int64_t items = end - begin;
    grain = std::max<int64_t>(grain, (items + kMaxChunks - 1) / kMaxChunks);
    const int64_t chunks = (items + grain - 1) / grain;
    std::unique_lock<std::mutex> caller(caller_mu_, std::try_to_lock);
    if (threads <= 1 || chunks <= 1 || in_helper_ || !caller.owns_lock()) {
      f(begin, end);
      return;
    }
    ensure_helpers(threads - 1);
    job_call_ = [](const void* ctx, int64_t b, int64_t e) { (*static_cast<const F*>(ctx))(b, e); };
    job_ctx_ = &f;
    job_begin_ = begin;
    job_end_ = end;
    job_grain_ = grain;
    job_helpers_.store(threads - 1, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    const uint64_t gen = (generation_ = (generation_ + 1) & kGenMask);
    state_.store(pack(gen, chunks, 0), std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_mu_);
      wake_.notify_all();
    }
    int64_t ran = 0, chunk;
    while (claim(gen, chunk)) {
      run_chunk(chunk);
      ++ran;
    }
    // Every chunk is claimed now; wait for those a helper still runs.
    const int64_t want = chunks - ran;
    while (done_.load(std::memory_order_acquire) < want) std::this_thread::yield();
  }

 private:
  static constexpr uint64_t kGenMask = (1ull << 24) - 1;
  static constexpr int64_t kMaxChunks = (1 << 20) - 1;  // 20 bits each for the count and the next chunk
  static uint64_t pack(uint64_t gen, int64_t chunks, int64_t next) {
    return (gen << 40) | (static_cast<uint64_t>(chunks) << 20) | static_cast<uint64_t>(next);
  }

  ClaimPool() = default;

  bool claim(uint64_t gen, int64_t& chunk) {
    uint64_t v = state_.load(std::memory_order_acquire);
    for (;;) {
      const int64_t chunks = static_cast<int64_t>((v >> 20) & kMaxChunks), next = static_cast<int64_t>(v & kMaxChunks);
      if ((v >> 40) != gen || next >= chunks) return false;
      if (state_.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel, std::memory_order_acquire)) {
        chunk = next;
        return true;
      }
    }
  }

  void run_chunk(int64_t chunk) {
    const int64_t b = job_begin_ + chunk * job_grain_;
    job_call_(job_ctx_, b, std::min(job_end_, b + job_grain_));
  }

  void ensure_helpers(int wanted) {
    while (static_cast<int>(helpers_) < wanted) {
      const int index = helpers_++;
      std::thread([this, index] { helper_loop(index); }).detach();
    }
  }

  void helper_loop(int index) {
    in_helper_ = true;
    uint64_t seen = state_.load(std::memory_order_acquire) >> 40;
    auto spin_until = std::chrono::steady_clock::now();
    for (;;) {
      const uint64_t v = state_.load(std::memory_order_acquire);
      const uint64_t gen = v >> 40;
      if (gen != seen) {
        seen = gen;
        // Helpers past the job's thread count sit it out (a stale read only changes who helps).
        int64_t chunk;
        if (index < job_helpers_.load(std::memory_order_acquire))
          while (claim(gen, chunk)) {
            run_chunk(chunk);
            done_.fetch_add(1, std::memory_order_acq_rel);
          }
        spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
        continue;
      }
      if (std::chrono::steady_clock::now() < spin_until) {
        for (int i = 0; i < 64; ++i) SPECDEC_PAUSE();
        continue;
      }
      std::unique_lock<std::mutex> lock(sleep_mu_);
      sleeping_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, [&] { return (state_.load(std::memory_order_seq_cst) >> 40) != seen; });
      sleeping_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

  // A helper keeps spinning this long after its last job: the gaps between one forward's
  // projections are microseconds, those between decoding steps longer (it sleeps then).
  static constexpr int kSpinMicros = 200;

  std::atomic<uint64_t> state_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleeping_{0};
  std::atomic<int> helpers_{0};
  uint64_t generation_ = 0;  // written by the caller holding caller_mu_
  void (*job_call_)(const void*, int64_t, int64_t) = nullptr;
  const void* job_ctx_ = nullptr;
  int64_t job_begin_ = 0, job_end_ = 0, job_grain_ = 1;
  std::atomic<int> job_helpers_{0};
  std::mutex caller_mu_, sleep_mu_;
  std::condition_variable wake_;
  static inline thread_local bool in_helper_ = false;
};

// f(begin_chunk, end_chunk) over [begin, end) in chunks of at least `grain` items, on
// at::get_num_threads() threads at most (see ClaimPool). Inside an OpenMP region: serially.
template <typename F>
void claim_parallel_range(int64_t begin, int64_t end, int64_t grain, const F& f) {
  if (end <= begin) return;
  const int threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  ClaimPool::instance().run(begin, end, std::max<int64_t>(grain, 1), threads, f);
}

// The grain for streaming a weight of `items` rows (or panels) of `item_bytes` each through
// claim_parallel_range: chunks of 256 KiB .. 2 MiB, aiming at 4 per thread. Larger chunks stream
// better (each thread's run is contiguous and its prefetch stops at the chunk's end: measured 82%
// -> 86% of the machine's read bandwidth at one token, 2 threads, from 196 KiB chunks to 2 MiB);
// enough of them keep the threads balanced. Shared by the packed and the GGUF linears.
inline int64_t streaming_grain(int64_t items, int64_t item_bytes) {
  item_bytes = std::max<int64_t>(1, item_bytes);
  const int64_t threads = std::max(1, at::get_num_threads());
  const int64_t chunk_bytes = std::clamp<int64_t>(items * item_bytes / (4 * threads), 256 << 10, 2 << 20);
  return std::max<int64_t>(1, chunk_bytes / item_bytes);
}

}  // namespace specdec::ops
