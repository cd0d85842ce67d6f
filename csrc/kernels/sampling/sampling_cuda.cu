// CUDA kernels of `sample` and `verify_chain` (torch-free).
//
// The unit of work is one logit row handled by one block of kThreads threads: the block streams the
// row with 16-byte loads (8 bf16 / fp16 or 4 fp32 logits per load) and folds, in one pass,
//   online softmax statistics (max, sum exp, entropy dot; distribution.h SoftmaxStats),
//   the NaN / +inf flags, the argmax (greedy) and, when the row is unfiltered, the Gumbel race
// (distribution.h: Philox only for elements that can still win), then reduces them with CUB.
// Top-k / top-p rows first find their threshold by filter.h's radix select (filter_cuda.cuh: counts
// for top-k, probability mass for top-p), then run the same pass restricted to it.
//
//   parallel: verify_positions_kernel  grid = num_drafts + batch blocks (one per target row = one
//             per (row, position)), each deciding its position alone -> PositionResult[t];
//             verify_walk_kernel        one thread per row walks its results (tiny).
//   serial:   verify_serial_kernel     grid = batch blocks, each walking its row's positions and
//             stopping at the first rejection (a rejected tail is never read).
//   sample:   sample_kernel            grid = rows blocks.
// Rows of rejection sampling read the draft row at the same position; a rejected position makes one
// more pass over both rows for the residual race.
#include "kernels/sampling/sampling_cuda.h"

#include <cub/block/block_reduce.cuh>

#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/philox.h"
#include "kernels/common/status.h"
#include "kernels/sampling/distribution.h"
#include "kernels/sampling/filter.h"
#include "kernels/sampling/filter_cuda.cuh"

namespace specdec {
namespace sampling {
namespace {

// The per-row helpers below are __noinline__: each is a whole pass (or several) over a row, so a
// call costs nothing, and one copy per dtype keeps the compile time of this file reasonable.
//
// 256 threads, at most 64 registers (kMinBlocks = 4 blocks per SM): the parallel strategy's grid
// of B * (k + 1) blocks (288 at B = 32, k = 8) then fits in one wave on an H200 (132 SMs x 4 = 528
// slots; at 512 threads only 2 blocks fit per SM and a second, nearly empty wave would double the
// time), and kUnroll 16-byte loads per thread keep 4 x 256 x 64 B = 64 KiB in flight per SM, more
// than HBM latency x per-SM bandwidth (~0.8 us x 36 GB/s).
constexpr int kThreads = 256;
constexpr int kMinBlocks = 4;

// ---- loads ----------------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ float load_one(const T* row, int64_t i) {
  return to_float(row[i]);
}

// Calls f(i, float(row[i])) for every element this thread owns, in increasing i. 16-byte vector
// loads when the row is 16-byte aligned, kUnroll of them issued before any is used so that enough
// bytes are in flight per SM to cover HBM latency (the tail and unaligned rows fall back to
// element loads). __ldg: the rows are read-only for the kernel's lifetime.
constexpr int kUnroll = 4;

template <typename T, typename F>
__device__ __forceinline__ void for_each_logit(const T* row, int64_t vocab, F&& f) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  int64_t start = 0;
  if ((reinterpret_cast<uintptr_t>(row) & 15u) == 0) {
    const int64_t num_vec = vocab / kVec;
    const uint4* vec = reinterpret_cast<const uint4*>(row);
    int64_t b = threadIdx.x;
    for (; b + (kUnroll - 1) * kThreads < num_vec; b += kUnroll * kThreads) {
      uint4 w[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) w[u] = __ldg(vec + b + u * kThreads);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        T elems[kVec];
        memcpy(elems, &w[u], sizeof(uint4));
#pragma unroll
        for (int e = 0; e < kVec; ++e) f((b + u * kThreads) * kVec + e, to_float(elems[e]));
      }
    }
    for (; b < num_vec; b += kThreads) {
      const uint4 w = __ldg(vec + b);
      T elems[kVec];
      memcpy(elems, &w, sizeof(w));
#pragma unroll
      for (int e = 0; e < kVec; ++e) f(b * kVec + e, to_float(elems[e]));
    }
    start = num_vec * kVec;
  }
  for (int64_t i = start + threadIdx.x; i < vocab; i += kThreads) f(i, load_one(row, i));
}

// One draw of a stream (the lane select avoids a local-memory array index).
__device__ __forceinline__ uint32_t draw(const RandomStream& stream, int64_t i) {
  const PhiloxOut o = stream.block(static_cast<uint32_t>(i >> 2));
  const int lane = static_cast<int>(i & 3);
  return lane == 0 ? o.x[0] : lane == 1 ? o.x[1] : lane == 2 ? o.x[2] : o.x[3];
}

// ---- block reductions -----------------------------------------------------------------------------

// Everything one pass over a row gathers, per thread, then per block.
struct PassState {
  SoftmaxStats stats;  // over kept elements
  RaceBest argmax;     // key = s (greedy; the first maximum)
  RaceBest race;       // key = s + Gumbel (only when racing in this pass)
  int bad;             // NaN or +inf seen

  __device__ static PassState empty() {
    return {SoftmaxStats::empty(), RaceBest::none(), RaceBest::none(), 0};
  }
  __device__ static PassState merge(const PassState& a, const PassState& b) {
    PassState out;
    out.stats = SoftmaxStats::merge(a.stats, b.stats);
    out.argmax = RaceBest::merge(a.argmax, b.argmax);
    out.race = RaceBest::merge(a.race, b.race);
    out.bad = a.bad | b.bad;
    return out;
  }
};

struct MergePass {
  __device__ PassState operator()(const PassState& a, const PassState& b) const {
    return PassState::merge(a, b);
  }
};
struct MergeRace {
  __device__ RaceBest operator()(const RaceBest& a, const RaceBest& b) const {
    return RaceBest::merge(a, b);
  }
};

// Reduce over the block and hand the result to every thread.
template <typename V, typename Op>
__device__ V block_all_reduce(const V& value, Op op) {
  using Reduce = cub::BlockReduce<V, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ V result;
  const V r = Reduce(temp).Reduce(value, op);
  if (threadIdx.x == 0) result = r;
  __syncthreads();
  const V out = result;
  __syncthreads();
  return out;
}

// ---- one row's distribution ----------------------------------------------------------------------

struct Dist {
  bool ok;          // false: the row is unusable (kStatusNonFiniteLogits)
  RowDist row;      // max, threshold, 1 / Z (filter.h)
  float entropy;
  int64_t argmax;   // first maximum (greedy)
  int64_t sampled;  // Gumbel race winner when `race` was requested, else -1
};

// The pass: statistics over s >= threshold (flags and argmax over the whole row), plus the race
// over the kept elements when `stream` is given. argmax.key is the exact max of s = l / T.
//
// Unfiltered rows with a finite temperature (the common case, and greedy with T = 1) take the fast
// path, which keeps the pass memory-bound: the statistics use s' = l * (1/T) (within 2^-22 |s| of
// s) and __expf (MUFU), the max / argmax / flags are taken on l (s = l / T is monotone in l, so
// max s = max l / T exactly, and an overflow to +inf shows in it), and only race candidates get
// the exact s = l / T; the pruning bound adds |s'| * 1e-6 of slack so it stays exact. Filtered
// rows (whose kept set must be decided on the exact s) and T = +inf take the exact path.
template <typename T>
__device__ __noinline__ PassState row_pass(const T* row, int64_t vocab, float temperature,
                                           float threshold, const RandomStream* stream) {
  PassState st = PassState::empty();
  if (threshold == -INFINITY && temperature < INFINITY) {
    const float inv_t = 1.0f / temperature;
    float lmax = -INFINITY;
    for_each_logit(row, vocab, [&](int64_t i, float l) {
      st.bad |= static_cast<int>(l != l);
      if (l > lmax) {  // each thread sees increasing i: the first max is kept
        lmax = l;
        st.argmax.index = i;
      }
      const float s = l * inv_t;
      if (s > -INFINITY) {  // skips -inf and NaN
        SoftmaxStats& a = st.stats;
        if (s > a.max) {
          const float scale = __expf(a.max - s);  // 0 when a.max = -inf
          a.dot = a.max == -INFINITY ? 0.0f : (a.dot + a.sum * (a.max - s)) * scale;
          a.sum *= scale;
          a.max = s;
        }
        const float d = s - a.max;
        const float e = __expf(d);
        a.sum += e;
        a.dot += e > 0.0f ? e * d : 0.0f;
        // the bound gets |s'| * 1e-6 of slack for s' = l * (1/T) != l / T (see above)
        if (stream != nullptr && gumbel_may_win(s + fabsf(s) * 1e-6f, st.race.key)) {
          st.race.offer(gumbel_key(l / temperature, draw(*stream, i)), i);
        }
      }
    });
    st.argmax.key = lmax;
    st = block_all_reduce(st, MergePass());
    st.argmax.key = st.argmax.key / temperature;
    st.bad |= static_cast<int>(st.argmax.key == INFINITY);
    return st;
  }
  for_each_logit(row, vocab, [&](int64_t i, float l) {
    const float s = l / temperature;
    st.bad |= static_cast<int>(s != s) | static_cast<int>(s == INFINITY);
    if (s > st.argmax.key) st.argmax = {s, i};  // each thread sees increasing i: first max kept
    if (s >= threshold) {
      st.stats.add(s);
      if (stream != nullptr && gumbel_may_win(s, st.race.key)) {
        st.race.offer(gumbel_key(s, draw(*stream, i)), i);
      }
    }
  });
  return block_all_reduce(st, MergePass());
}

// filter_cuda.cuh's selects over s = l / T of one row (one copy per dtype: __noinline__).
template <typename T>
__device__ __noinline__ float kth_largest(const T* row, int64_t vocab, float temperature, int64_t k) {
  return block_kth_largest(
      [&](auto&& f) { for_each_logit(row, vocab, [&](int64_t, float l) { f(l / temperature); }); }, k);
}

template <typename T>
__device__ __noinline__ float nucleus_threshold(const T* row, int64_t vocab, float temperature,
                                                float threshold, float m, float inv_z, float top_p) {
  return block_nucleus_threshold(
      [&](auto&& f) { for_each_logit(row, vocab, [&](int64_t, float l) { f(l / temperature); }); },
      threshold, m, inv_z, top_p);
}

// The distribution of one logit row (temperature > 0) under top-k / top-p; with `stream` the
// Gumbel race winner too. Block-collective.
template <typename T>
__device__ __noinline__ Dist build_dist(const T* row, int64_t vocab, float temperature, int32_t top_k,
                           float top_p, const RandomStream* stream) {
  const bool filtered = top_k_active(top_k, vocab) || top_p_active(top_p);
  PassState st = row_pass(row, vocab, temperature, -INFINITY, filtered ? nullptr : stream);
  Dist d;
  d.ok = !row_unusable(st.bad != 0, st.argmax.key);
  d.row.max = st.argmax.key;
  d.argmax = st.argmax.index;
  d.row.threshold = -INFINITY;
  d.sampled = st.race.index;
  if (!d.ok) return d;
  if (filtered) {
    if (top_k_active(top_k, vocab)) {
      d.row.threshold = kth_largest(row, vocab, temperature, top_k);
      st = row_pass(row, vocab, temperature, d.row.threshold, nullptr);
    }
    if (top_p_active(top_p)) {
      const float t = nucleus_threshold(row, vocab, temperature, d.row.threshold, d.row.max,
                                        1.0f / st.stats.sum, top_p);
      if (t > d.row.threshold) d.row.threshold = t;
    }
    st = row_pass(row, vocab, temperature, d.row.threshold, stream);
    d.sampled = st.race.index;
  }
  // the online max equals the row max (it is always kept); rescale in case rounding differs
  d.row.inv_z = 1.0f / (st.stats.sum * exp_nonpos(st.stats.max - d.row.max));
  d.entropy = st.stats.entropy();
  if (stream == nullptr) d.sampled = -1;
  return d;
}

template <typename T>
__device__ float prob_of(const T* row, const RowDist& d, float temperature, int64_t x) {
  return prob(d, load_one(row, x) / temperature);
}

// The residual race argmax r_i / E_i over r = max(0, p - q) (or over p when `use_p`); returns
// (winner, whether any r_i > 0).
template <typename T>
__device__ __noinline__ RaceBest residual_pass(const T* target, const T* draft, int64_t vocab,
                                               float temperature, const RowDist& dt,
                                               const RowDist& dq, const RandomStream& stream,
                                               bool use_p) {
  RaceBest best = RaceBest::none();
  for_each_logit(target, vocab, [&](int64_t i, float lt) {
    const float p = prob(dt, lt / temperature);
    const float r = use_p ? p : p - prob(dq, load_one(draft, i) / temperature);
    if (residual_may_win(r, best.key)) best.offer(residual_key(r, draw(stream, i)), i);
  });
  return block_all_reduce(best, MergeRace());
}

// ---- one position of verify_chain ----------------------------------------------------------------

// The decision at position j of row `row` (its precheck passed); block-collective, every thread
// gets the result. Mirrors evaluate_position in sampling_cpu.cpp and reference/sampling.py.
// With `deferred` (the parallel strategy) a rejection does not run the residual race here: the
// distributions' statistics go to deferred[target row] and the token is kResidualPending, so only
// each row's first rejection pays for the residual pass (verify_residual_kernel), not every
// rejected position of the tail.
template <typename T>
__device__ __noinline__ PositionResult evaluate_position(const VerifyArgs& a, int64_t row, int64_t j,
                                            PositionStats* deferred) {
  const RowParams& p = a.params;
  const int64_t lo = a.cu_num_draft[row];
  const int64_t k = a.cu_num_draft[row + 1] - lo;
  const T* target = static_cast<const T*>(a.target_logits) + (lo + row + j) * a.target_stride;
  const int64_t x = j < k ? a.draft_tokens[lo + j] : -1;
  const int64_t pos = p.position[row] + j;
  const uint64_t seed = static_cast<uint64_t>(p.seed[row]);
  const float temperature = p.temperature[row];
  const RowKind kind = row_kind(temperature, a.typical, a.draft_logits != nullptr);
  const PositionResult unusable{-1, kStatusNonFiniteLogits, 0};

  if (kind == kKindGreedy) {
    const PassState st = row_pass(target, a.vocab, 1.0f, -INFINITY, nullptr);
    if (row_unusable(st.bad != 0, st.argmax.key)) return unusable;
    return {st.argmax.index, kStatusOk, x == st.argmax.index ? 1 : 0};
  }
  const RandomStream sample_stream(seed, pos, kPurposeSample, 0);
  const bool race_needed = x < 0 || kind == kKindMatch || kind == kKindTypical;
  const Dist dt = build_dist(target, a.vocab, temperature, p.top_k[row], p.top_p[row],
                             race_needed ? &sample_stream : nullptr);
  if (!dt.ok) return unusable;
  if (x < 0 || kind == kKindMatch) return {dt.sampled, kStatusOk, dt.sampled == x ? 1 : 0};
  const float p_x = prob_of(target, dt.row, temperature, x);
  if (kind == kKindTypical) {
    if (accept_typical(p_x, dt.entropy, a.typical_epsilon, a.typical_alpha)) return {x, kStatusOk, 1};
    return {dt.sampled, kStatusOk, 0};
  }
  const T* draft = static_cast<const T*>(a.draft_logits) + (lo + j) * a.draft_stride;
  const Dist dq = build_dist(draft, a.vocab, temperature, p.top_k[row], p.top_p[row], nullptr);
  if (!dq.ok) return unusable;
  const float q_x = prob_of(draft, dq.row, temperature, x);
  const float u = uniform_open01(RandomStream(seed, pos, kPurposeAccept, 0).element(0));
  if (accept_draft(u, q_x, p_x)) return {x, kStatusOk, 1};
  if (deferred != nullptr) {
    if (threadIdx.x == 0) {
      deferred[lo + row + j] = {dt.row, dq.row};
    }
    return {kResidualPending, kStatusOk, 0};
  }
  const RandomStream residual_stream(seed, pos, kPurposeResidual, 0);
  RaceBest best =
      residual_pass(target, draft, a.vocab, temperature, dt.row, dq.row, residual_stream, false);
  if (best.index == INT64_MAX) {  // p <= q everywhere: the defined outcome is a sample from p
    best = residual_pass(target, draft, a.vocab, temperature, dt.row, dq.row, residual_stream, true);
  }
  return {best.index, kStatusOk, 0};
}

// ---- kernels --------------------------------------------------------------------------------------

template <typename T>
__global__ void __launch_bounds__(kThreads, kMinBlocks) sample_kernel(SampleArgs a) {
  const int64_t row = blockIdx.x;
  const float temperature = a.params.temperature[row];
  int64_t token = -1;
  int32_t status = kStatusOk;
  const T* logits = static_cast<const T*>(a.logits) + row * a.logits_stride;
  if (bad_params(temperature, a.params.top_p[row])) {
    status = kStatusBadSamplingParams;
  } else if (temperature == 0.0f) {
    const PassState st = row_pass(logits, a.vocab, 1.0f, -INFINITY, nullptr);
    if (row_unusable(st.bad != 0, st.argmax.key)) {
      status = kStatusNonFiniteLogits;
    } else {
      token = st.argmax.index;
    }
  } else {
    const RandomStream stream(static_cast<uint64_t>(a.params.seed[row]), a.params.position[row],
                              a.purpose, a.substream);
    const Dist d = build_dist(logits, a.vocab, temperature, a.params.top_k[row],
                              a.params.top_p[row], &stream);
    if (d.ok) {
      token = d.sampled;
    } else {
      status = kStatusNonFiniteLogits;
    }
  }
  if (threadIdx.x == 0) {
    a.tokens[row] = token;
    a.status[row] = status;
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) verify_serial_kernel(VerifyArgs a) {
  const int64_t row = blockIdx.x;
  walk_row(a, row, [&](int64_t j) { return evaluate_position<T>(a, row, j, nullptr); },
           threadIdx.x == 0);
}

// The row owning target logit row t, or -1 (t outside every valid row's range).
__device__ int64_t row_of_target(const VerifyArgs& a, int64_t t) {
  const int64_t found = target_owner(a, t);  // largest r with cu[r] + r <= t
  if (found < 0 || !row_layout_ok(a, found)) return -1;
  return t <= a.cu_num_draft[found + 1] + found ? found : -1;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    verify_positions_kernel(VerifyArgs a, PositionResult* results, PositionStats* deferred) {
  const int64_t t = blockIdx.x;
  const int64_t row = row_of_target(a, t);
  PositionResult r{-1, kStatusOk, 0};
  if (row >= 0 && verify_row_precheck(a, row) == 0) {  // else the walk flags the row
    r = evaluate_position<T>(a, row, t - a.cu_num_draft[row] - row, deferred);
  }
  if (threadIdx.x == 0) results[t] = r;
}

__global__ void verify_walk_kernel(VerifyArgs a, const PositionResult* results) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (row >= a.batch) return;
  const PositionResult* mine = results + (row_layout_ok(a, row) ? a.cu_num_draft[row] + row : 0);
  walk_row(a, row, [&](int64_t j) { return mine[j]; });
}

// The residual race of each row whose walk stopped at a deferred rejection (parallel strategy):
// one pass over that position's target and draft rows.
template <typename T>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    verify_residual_kernel(VerifyArgs a, const PositionStats* deferred) {
  const int64_t row = blockIdx.x;
  if (a.status[row] != kStatusOk) return;
  const int64_t j = a.num_accepted[row];
  int64_t* token = a.tokens + row * (a.max_draft + 1) + j;
  if (*token != kResidualPending) return;  // every thread reads it before thread 0 rewrites it
  const int64_t lo = a.cu_num_draft[row];
  const PositionStats st = deferred[lo + row + j];
  const float temperature = a.params.temperature[row];
  const T* target = static_cast<const T*>(a.target_logits) + (lo + row + j) * a.target_stride;
  const T* draft = static_cast<const T*>(a.draft_logits) + (lo + j) * a.draft_stride;
  const RandomStream stream(static_cast<uint64_t>(a.params.seed[row]), a.params.position[row] + j,
                            kPurposeResidual, 0);
  RaceBest best = residual_pass(target, draft, a.vocab, temperature, st.target, st.draft, stream,
                                false);
  if (best.index == INT64_MAX) {
    best = residual_pass(target, draft, a.vocab, temperature, st.target, st.draft, stream, true);
  }
  if (threadIdx.x == 0) *token = best.index;
}

template <typename T>
cudaError_t launch_verify_typed(const VerifyArgs& a, bool parallel, void* workspace,
                                cudaStream_t stream) {
  if (a.batch == 0) return cudaSuccess;
  if (!parallel) {
    verify_serial_kernel<T><<<static_cast<unsigned>(a.batch), kThreads, 0, stream>>>(a);
    return cudaGetLastError();
  }
  const int64_t targets = a.num_drafts + a.batch;
  auto* results = static_cast<PositionResult*>(workspace);
  auto* deferred = reinterpret_cast<PositionStats*>(results + targets);
  verify_positions_kernel<T>
      <<<static_cast<unsigned>(targets), kThreads, 0, stream>>>(a, results, deferred);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  constexpr int kWalkThreads = 128;
  const unsigned blocks = static_cast<unsigned>((a.batch + kWalkThreads - 1) / kWalkThreads);
  verify_walk_kernel<<<blocks, kWalkThreads, 0, stream>>>(a, results);
  err = cudaGetLastError();
  if (err != cudaSuccess || a.draft_logits == nullptr) return err;
  verify_residual_kernel<T><<<static_cast<unsigned>(a.batch), kThreads, 0, stream>>>(a, deferred);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_sample_typed(const SampleArgs& a, cudaStream_t stream) {
  if (a.rows == 0) return cudaSuccess;
  sample_kernel<T><<<static_cast<unsigned>(a.rows), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_sample(const SampleArgs& a, cudaStream_t stream) {
  switch (a.dtype) {
    case DType::kFloat32: return launch_sample_typed<float>(a, stream);
    case DType::kFloat16: return launch_sample_typed<Half16>(a, stream);
    case DType::kBFloat16: return launch_sample_typed<BFloat16>(a, stream);
    case DType::kFloat64: break;  // float64 logits run on the CPU only (compile time)
  }
  return cudaErrorInvalidValue;
}

size_t verify_chain_workspace_bytes(int64_t num_drafts, int64_t batch) {
  return static_cast<size_t>(num_drafts + batch) * (sizeof(PositionResult) + sizeof(PositionStats));
}

cudaError_t launch_verify_chain(const VerifyArgs& a, bool parallel, void* workspace,
                                cudaStream_t stream) {
  switch (a.dtype) {
    case DType::kFloat32: return launch_verify_typed<float>(a, parallel, workspace, stream);
    case DType::kFloat16: return launch_verify_typed<Half16>(a, parallel, workspace, stream);
    case DType::kBFloat16: return launch_verify_typed<BFloat16>(a, parallel, workspace, stream);
    case DType::kFloat64: break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace sampling
}  // namespace specdec
