// CUDA kernels of the tree family (torch-free). Launchers at the bottom; shapes in tree.h.
//
//   build_tree   kernel 1: one block per batch row. Validates the row (status), then one thread per
//                node: depth and ancestor bits by walking parents (each walk < node index steps),
//                first child / next sibling by scanning the row's parents (staged in shared memory).
//                kernel 2: grid-stride expansion of the packed bits into the bool mask and the
//                additive Hugging Face mask (the largest outputs, written coalesced).
//   verify_tree  one block per batch row walks its tree. At each visited node the block makes a few
//                passes over the node's logit row (V = 128k: 32 warps keep enough loads in flight);
//                each thread owns groups of 4 consecutive tokens, one Philox call per group. Every
//                branch depends only on block-reduced values, so the whole block follows one path.
//   compact_kv   one block per (row, cache tensor); threads own fixed (head, vector) lanes and
//                copy the path's slots in increasing order, which is what makes overlapping
//                sources and destinations safe (compact.h): no barrier is needed between slots.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/dtype.h"
#include "kernels/common/philox.h"
#include "kernels/common/status.h"
#include "kernels/sampling/chain.h"
#include "kernels/sampling/distribution.h"
#include "kernels/sampling/filter.h"
#include "kernels/sampling/filter_cuda.cuh"
#include "kernels/tree/compact.h"
#include "kernels/tree/tree.h"
#include "kernels/tree/tree_walk.h"

namespace specdec {
namespace tree {
namespace {

using sampling::RaceBest;
using sampling::RowDist;

constexpr int kBuildThreads = 256;
constexpr int kDenseThreads = 256;
constexpr int kVerifyThreads = 1024;  // 32 warps per row: enough loads in flight for one SM
constexpr int kCompactThreads = 256;
constexpr int kMaxCachesPerLaunch = 64;  // 512 bytes of pointers in the kernel parameters

// ---------------------------------------------------------------------------------------------
// build_tree

// Dynamic shared memory: the row's parents as int32 (M entries).
__global__ void build_tree_rows_kernel(BuildTreeArgs a) {
  extern __shared__ int32_t parents_s[];
  const int64_t b = blockIdx.x;
  const int64_t m = a.max_nodes, packed_bytes = (m + 7) / 8;
  const int64_t lo = a.cu[b], hi = a.cu[b + 1];
  const bool bounds = row_bounds_ok(lo, hi, a.num_flat, m);
  const int64_t n = bounds ? hi - lo : 0;
  const int64_t* parents = a.parents + (bounds ? lo : 0);
  const int64_t cache_len = a.cache_len[b];
  bool bad = !bounds || !cache_len_ok(cache_len, m, a.hf_mask != nullptr, a.max_prefix);
  for (int64_t v = threadIdx.x; v < n; v += blockDim.x) {
    const bool ok = node_ok(parents, v);
    bad |= !ok;
    parents_s[v] = ok ? static_cast<int32_t>(parents[v]) : -1;
  }
  const bool row_bad = __syncthreads_or(bad);  // also publishes parents_s
  const int64_t live = row_bad ? 0 : n;
  if (threadIdx.x == 0) a.status[b] = row_bad ? kStatusMalformedTree : kStatusOk;
  for (int64_t v = threadIdx.x; v < m; v += blockDim.x) {
    const int64_t o = b * m + v;
    int64_t depth = -1, first = -1, sibling = -1;
    uint8_t* packed = a.packed_mask + o * packed_bytes;
    for (int64_t k = 0; k < packed_bytes; ++k) packed[k] = 0;
    if (v < live) {
      depth = 0;
      for (int64_t u = v; u > 0; u = parents_s[u]) {  // parents_s[u] < u: at most v steps
        packed[u >> 3] |= static_cast<uint8_t>(1u << (u & 7));
        ++depth;
      }
      packed[0] |= 1u;  // the root
      for (int64_t c = v + 1; c < live && first < 0; ++c)
        if (parents_s[c] == v) first = c;
      const int64_t p = parents_s[v];
      for (int64_t c = v + 1; v > 0 && c < live && sibling < 0; ++c)
        if (parents_s[c] == p) sibling = c;
    } else {
      packed[v >> 3] |= static_cast<uint8_t>(1u << (v & 7));  // padded rows see only themselves
    }
    a.depth[o] = depth;
    a.positions[o] = cache_len + (depth > 0 ? depth : 0);
    a.first_child[o] = first;
    a.next_sibling[o] = sibling;
  }
}

// tree_mask (B, M, M) and hf_mask (B, 1, M, P + M) from the packed bits. HfBits: uint16_t /
// uint32_t / uint64_t, the element's bit pattern (0 visible, `hidden` not).
template <typename HfBits>
__global__ void build_tree_dense_kernel(BuildTreeArgs a, HfBits hidden) {
  const int64_t m = a.max_nodes, packed_bytes = (m + 7) / 8;
  const int64_t mask_total = a.batch * m * m;
  const int64_t width = a.max_prefix + m;
  const int64_t hf_total = a.hf_mask != nullptr ? a.batch * m * width : 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       i < mask_total + hf_total; i += stride) {
    if (i < mask_total) {
      const int64_t row = i / m, j = i % m;  // row = b * M + query node
      a.tree_mask[i] = (a.packed_mask[row * packed_bytes + (j >> 3)] >> (j & 7)) & 1u;
      continue;
    }
    const int64_t e = i - mask_total;
    const int64_t row = e / width, j = e % width;
    const int64_t b = row / m, q = row % m;
    bool visible;
    if (j < a.max_prefix) {
      const bool ok = a.status[b] == kStatusOk;
      const int64_t n = ok ? a.cu[b + 1] - a.cu[b] : 0;
      visible = q < n && j < a.cache_len[b];
    } else {
      const int64_t k = j - a.max_prefix;
      visible = (a.packed_mask[row * packed_bytes + (k >> 3)] >> (k & 7)) & 1u;
    }
    static_cast<HfBits*>(a.hf_mask)[e] = visible ? HfBits(0) : hidden;
  }
}

// ---------------------------------------------------------------------------------------------
// Block reductions (blockDim.x a multiple of 32). `red` is shared scratch of >= 32 entries; the
// leading barrier makes back-to-back calls on the same scratch safe.

__device__ __forceinline__ RaceBest shfl_down(RaceBest v, int off) {
  RaceBest o;
  o.key = __shfl_down_sync(0xffffffffu, v.key, off);
  o.index = __shfl_down_sync(0xffffffffu, v.index, off);
  return o;
}
template <typename T>
__device__ __forceinline__ T shfl_down(T v, int off) {
  return __shfl_down_sync(0xffffffffu, v, off);
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct BestOp {
  __device__ RaceBest operator()(RaceBest a, RaceBest b) const { return RaceBest::merge(a, b); }
};

template <typename T, typename Op>
__device__ T block_reduce(T v, Op op, T identity, T* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = op(v, shfl_down(v, off));
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? red[lane] : identity;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = op(v, shfl_down(v, off));
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  return red[0];
}

// Shared state of one verify block.
struct VerifyShared {
  RaceBest best[32];
  float f[32];
  int32_t warp_counts[32];
  int32_t found;
  int32_t accept;
};

// ---------------------------------------------------------------------------------------------
// verify_tree: passes over one logit row

template <typename T>
struct LogitRow {
  const T* p;
  int64_t vocab;
  float temperature;
  // s = float(l) / T, the sampling transform; greedy (T = 0) reads l itself
  __device__ float s(int64_t i) const {
    return temperature > 0.0f ? to_float(p[i]) / temperature : to_float(p[i]);
  }
  // for_each_s of filter_cuda.cuh: this thread's elements, strided by the block
  template <class F>
  __device__ void for_each_s(F&& f) const {
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) f(s(i));
  }
};

// Max (with the first index holding it) and usability of a row: pass A of every decision.
template <typename T>
__device__ RaceBest scan_row(const LogitRow<T>& row, VerifyShared& sh, bool& usable) {
  RaceBest best = RaceBest::none();
  bool bad = false;
  for (int64_t i = threadIdx.x; i < row.vocab; i += blockDim.x) {
    const float x = row.s(i);
    bad |= sampling::nan_or_posinf(x);
    if (x > -INFINITY) best.offer(x, i);
  }
  const bool any_bad = __syncthreads_or(bad);
  best = block_reduce(best, BestOp{}, RaceBest::none(), sh.best);
  usable = !sampling::row_unusable(any_bad, best.key);  // key stays -inf when nothing is above
  return best;
}

template <typename T>
__device__ float sum_weights_block(const LogitRow<T>& row, float threshold, float max,
                                   VerifyShared& sh) {
  float z = 0.0f;
  for (int64_t i = threadIdx.x; i < row.vocab; i += blockDim.x) {
    z += sampling::weight(threshold, max, row.s(i));
  }
  return block_reduce(z, SumOp{}, 0.0f, sh.f);
}

// The filter + normaliser of a row (top-k, then top-p over the top-k softmax); the thresholds by
// filter.h's radix select, run by the whole block (filter_cuda.cuh).
template <typename T>
__device__ RowDist make_dist_block(const LogitRow<T>& row, float max, int64_t top_k, float top_p,
                                   VerifyShared& sh) {
  RowDist d{max, -INFINITY, 0.0f};
  auto for_each_s = [&](auto&& f) { row.for_each_s(f); };
  if (sampling::top_k_active(top_k, row.vocab)) {
    d.threshold = sampling::block_kth_largest(for_each_s, top_k);
  }
  float z = sum_weights_block(row, d.threshold, max, sh);
  if (sampling::top_p_active(top_p)) {
    const float t =
        sampling::block_nucleus_threshold(for_each_s, d.threshold, max, 1.0f / z, top_p);
    if (t > d.threshold) {  // (-inf, no cut found, keeps everything)
      d.threshold = t;
      z = sum_weights_block(row, d.threshold, max, sh);
    }
  }
  d.inv_z = 1.0f / z;
  return d;
}

// Gumbel race over kept tokens; each thread owns groups of 4 tokens (one Philox block), pruned
// exactly against the thread's best so far (distribution.h).
template <typename T>
__device__ int64_t race_block(const LogitRow<T>& row, const RowDist& d, const RandomStream& stream,
                              VerifyShared& sh) {
  RaceBest best = RaceBest::none();
  const int64_t groups = (row.vocab + 3) / 4;
  for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
    float x[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int64_t i = 4 * g + k;
      const float s = i < row.vocab ? row.s(i) : -INFINITY;
      x[k] = sampling::kept(d, s) ? s : -INFINITY;
    }
    sampling::offer_group<sampling::GumbelRace>(stream, g, x, best);
  }
  return block_reduce(best, BestOp{}, RaceBest::none(), sh.best).index;
}

// The children of v in index order into kids (shared, >= n entries); returns their count.
__device__ int collect_children(const int64_t* parents, int64_t n, int64_t v, int32_t* kids,
                                VerifyShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  int total = 0;
  for (int64_t base = v + 1; base < n; base += blockDim.x) {
    const int64_t c = base + threadIdx.x;
    const bool is_kid = c < n && parents[c] == v;
    const unsigned mask = __ballot_sync(0xffffffffu, is_kid);
    __syncthreads();
    if (lane == 0) sh.warp_counts[warp] = __popc(mask);
    __syncthreads();
    int offset = total, sum = 0;
    for (int w = 0; w < warps; ++w) {
      offset += w < warp ? sh.warp_counts[w] : 0;
      sum += sh.warp_counts[w];
    }
    if (is_kid) kids[offset + __popc(mask & ((1u << lane) - 1u))] = static_cast<int32_t>(c);
    total += sum;
  }
  __syncthreads();
  return total;
}

// Index into kids of the first child whose token is y, -1 when none.
__device__ int first_child_with(const int64_t* tokens, const int32_t* kids, int count, int64_t y,
                                VerifyShared& sh) {
  if (threadIdx.x == 0) sh.found = 0x7fffffff;
  __syncthreads();
  for (int t = threadIdx.x; t < count; t += blockDim.x)
    if (tokens[kids[t]] == y) atomicMin(&sh.found, t);
  __syncthreads();
  const int found = sh.found;
  return found == 0x7fffffff ? -1 : found;
}

// Dynamic shared memory: kids, max_nodes int32.
template <typename T>
__global__ void __launch_bounds__(kVerifyThreads) verify_tree_kernel(VerifyTreeArgs a) {
  __shared__ VerifyShared sh;
  extern __shared__ int32_t kids[];
  const int64_t b = blockIdx.x, m = a.max_nodes, vocab = a.vocab;
  int64_t* out_tokens = a.tokens + b * m;
  int64_t* out_path = a.accepted_nodes + b * m;
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) out_tokens[j] = out_path[j] = -1;

  const int64_t lo = a.cu[b], hi = a.cu[b + 1];
  const float temperature = a.temperature[b], top_p = a.top_p[b];
  int32_t status = kStatusOk;
  int64_t n = 0;
  if (!row_bounds_ok(lo, hi, a.num_flat, m)) {
    status = kStatusMalformedTree;
  } else {
    n = hi - lo;
    bool bad_tree = false, bad_token = false;
    for (int64_t v = threadIdx.x; v < n; v += blockDim.x) {
      bad_tree |= !node_ok(a.parents + lo, v);
      const int64_t t = a.draft_tokens[lo + v];
      bad_token |= v > 0 && (t < 0 || t >= vocab);
    }
    if (__syncthreads_or(bad_tree)) status = kStatusMalformedTree;
    else if (sampling::bad_params(temperature, top_p)) status = kStatusBadSamplingParams;
    else if (__syncthreads_or(bad_token)) status = kStatusDraftTokenOutOfRange;
  }
  __syncthreads();  // the -1 fill above precedes every write below
  if (status != kStatusOk) {
    if (threadIdx.x == 0) {
      a.status[b] = status;
      a.num_accepted[b] = 0;
    }
    return;
  }
  const int64_t* parents = a.parents + lo;
  const int64_t* tokens = a.draft_tokens + lo;
  const uint64_t seed = static_cast<uint64_t>(a.seed[b]);
  const int64_t top_k = a.top_k[b];
  float* p_ws = a.workspace + b * vocab;  // (V,) adjusted target probabilities
  auto node_row = [&](const void* base, bool flat, int64_t row_stride, int64_t node_stride,
                      int64_t v) {
    const T* p = static_cast<const T*>(base);
    return LogitRow<T>{flat ? p + (lo + v) * node_stride : p + b * row_stride + v * node_stride,
                       vocab, temperature};
  };

  int64_t v = 0, depth = 0;
  if (threadIdx.x == 0) out_path[0] = 0;
  while (true) {
    const int64_t pos = a.position[b] + depth;  // absolute position of the token decided at v
    const LogitRow<T> target = node_row(a.target_logits, a.target_flat, a.target_row_stride,
                                        a.target_node_stride, v);
    bool usable;
    const RaceBest top = scan_row(target, sh, usable);
    if (!usable) {
      status = kStatusNonFiniteLogits;
      break;
    }
    const int count = collect_children(parents, n, v, kids, sh);
    int next = -1;  // index into kids
    int64_t emit = -1;
    if (temperature == 0.0f) {  // greedy: the first child equal to the argmax
      emit = top.index;
      next = first_child_with(tokens, kids, count, emit, sh);
    } else if (a.draft_logits == nullptr || count == 0) {  // one-hot drafts, or a leaf's bonus
      const RowDist d = make_dist_block(target, top.key, top_k, top_p, sh);
      emit = race_block(target, d, RandomStream(seed, pos, kPurposeSample, 0), sh);
      next = a.draft_logits == nullptr ? first_child_with(tokens, kids, count, emit, sh) : -1;
    } else {  // SpecInfer multi-step speculative sampling
      const RowDist d = make_dist_block(target, top.key, top_k, top_p, sh);
      const LogitRow<T> draft = node_row(a.draft_logits, a.draft_flat, a.draft_row_stride,
                                         a.draft_node_stride, v);
      bool draft_usable;
      const RaceBest dtop = scan_row(draft, sh, draft_usable);
      if (!draft_usable) {
        status = kStatusNonFiniteLogits;
        break;
      }
      const RowDist dq = make_dist_block(draft, dtop.key, top_k, top_p, sh);
      bool p_in_ws = false;  // p = prob(d, s) until the first rejection, then p_ws
      for (int attempt = 0; attempt < count; ++attempt) {
        if (threadIdx.x == 0) {
          const int64_t x = tokens[kids[attempt]];
          const float p_x = p_in_ws ? p_ws[x] : sampling::prob(d, target.s(x));
          const float u = uniform_open01(
              RandomStream(seed, pos, kPurposeAccept, static_cast<uint32_t>(attempt)).element(0));
          sh.accept = sampling::accept_draft(u, sampling::prob(dq, draft.s(x)), p_x);
        }
        __syncthreads();
        if (sh.accept) {
          next = attempt;
          break;
        }
        // r = max(0, p - q): the next p once normalised, or the residual to sample from
        float part = 0.0f;
        for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
          const float r = (p_in_ws ? p_ws[i] : sampling::prob(d, target.s(i))) -
                          sampling::prob(dq, draft.s(i));
          part += r > 0.0f ? r : 0.0f;
        }
        const float total = block_reduce(part, SumOp{}, 0.0f, sh.f);
        const bool last = attempt == count - 1;
        // Each thread rewrites only the entries it read, so no barrier is needed in between.
        for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
          const float p_i = p_in_ws ? p_ws[i] : sampling::prob(d, target.s(i));
          const float r = p_i - sampling::prob(dq, draft.s(i));
          const float rp = r > 0.0f ? r : 0.0f;
          // all rejected: race over r (p when r is zero); else p <- normalise(r) (unchanged at 0)
          p_ws[i] = total > 0.0f ? (last ? rp : rp / total) : p_i;
        }
        p_in_ws = true;
        __syncthreads();  // the race below reads entries other threads wrote
        if (last) {
          const RandomStream stream(seed, pos, kPurposeResidual, 0);
          RaceBest best = RaceBest::none();
          const int64_t groups = (vocab + 3) / 4;
          for (int64_t g = threadIdx.x; g < groups; g += blockDim.x) {
            float r[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) r[k] = 4 * g + k < vocab ? p_ws[4 * g + k] : 0.0f;
            sampling::offer_group<sampling::ResidualRace>(stream, g, r, best);
          }
          emit = block_reduce(best, BestOp{}, RaceBest::none(), sh.best).index;
        }
        __syncthreads();  // p_ws complete before the next attempt's test reads it
      }
    }
    if (next < 0) {
      if (threadIdx.x == 0) {
        out_tokens[depth] = emit;
        a.num_accepted[b] = depth;
        a.status[b] = kStatusOk;
      }
      return;
    }
    const int64_t c = kids[next];
    __syncthreads();  // every thread has read kids before the next node overwrites it
    if (threadIdx.x == 0) {
      out_tokens[depth] = tokens[c];
      out_path[depth + 1] = c;
    }
    v = c;
    ++depth;
  }
  // a flagged row: no token, nothing accepted
  __syncthreads();
  for (int64_t j = threadIdx.x; j < m; j += blockDim.x) out_tokens[j] = out_path[j] = -1;
  if (threadIdx.x == 0) {
    a.status[b] = status;
    a.num_accepted[b] = 0;
  }
}

// ---------------------------------------------------------------------------------------------
// compact_kv

__global__ void compact_validate_kernel(CompactArgs a) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b < a.batch) compact_row_ok(a, b);
}

struct CachePtrs {
  char* p[kMaxCachesPerLaunch];
};

// Vec: the copy unit (uint4 / uint2 / uint32_t / uint16_t / uint8_t), dividing the head row and
// every stride and base address.
template <typename Vec>
__global__ void compact_copy_kernel(CompactArgs a, CachePtrs caches) {
  const int64_t b = blockIdx.x;
  const int64_t* path = a.accepted_nodes + b * a.width;
  if (a.status[b] != kStatusOk || path[0] < 0) return;
  char* row_base = caches.p[blockIdx.y] + b * a.stride_b;
  const int64_t len = a.num_accepted[b] + 1, src = a.src_start[b], dst = a.dst_start[b];
  const int64_t vecs = a.row_bytes / static_cast<int64_t>(sizeof(Vec));
  const int64_t lanes = a.heads * vecs;
  for (int64_t j = 0; j < len; ++j) {  // increasing j, each lane by the same thread: compact.h
    const int64_t from = src + path[j], to = dst + j;
    if (from == to) continue;
    for (int64_t l = threadIdx.x; l < lanes; l += blockDim.x) {
      char* head = row_base + (l / vecs) * a.stride_h + (l % vecs) * static_cast<int64_t>(sizeof(Vec));
      *reinterpret_cast<Vec*>(head + to * a.stride_t) =
          *reinterpret_cast<const Vec*>(head + from * a.stride_t);
    }
  }
}

template <typename Vec>
cudaError_t launch_compact(const CompactArgs& a, char* const* caches, int64_t num_caches,
                           cudaStream_t stream) {
  for (int64_t first = 0; first < num_caches; first += kMaxCachesPerLaunch) {
    const int64_t count = num_caches - first < kMaxCachesPerLaunch ? num_caches - first
                                                                   : kMaxCachesPerLaunch;
    CachePtrs ptrs{};
    for (int64_t i = 0; i < count; ++i) ptrs.p[i] = caches[first + i];
    const dim3 grid(static_cast<unsigned>(a.batch), static_cast<unsigned>(count));
    compact_copy_kernel<Vec><<<grid, kCompactThreads, 0, stream>>>(a, ptrs);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

int build_tree_cuda(const BuildTreeArgs& a, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (a.batch == 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(a.max_nodes) * sizeof(int32_t);
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        build_tree_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  build_tree_rows_kernel<<<static_cast<unsigned>(a.batch), kBuildThreads, smem, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const int64_t total = a.batch * a.max_nodes *
                        (a.max_nodes + (a.hf_mask != nullptr ? a.max_prefix + a.max_nodes : 0));
  int64_t blocks = (total + kDenseThreads - 1) / kDenseThreads;
  blocks = blocks < 1 ? 1 : (blocks > 65535 ? 65535 : blocks);  // grid-stride beyond that
  const unsigned grid = static_cast<unsigned>(blocks);
  switch (a.hf_mask != nullptr ? a.hf_elem_size : 2) {
    case 2:
      build_tree_dense_kernel<uint16_t><<<grid, kDenseThreads, 0, stream>>>(
          a, static_cast<uint16_t>(a.hf_hidden_bits));
      break;
    case 4:
      build_tree_dense_kernel<uint32_t><<<grid, kDenseThreads, 0, stream>>>(
          a, static_cast<uint32_t>(a.hf_hidden_bits));
      break;
    default:
      build_tree_dense_kernel<uint64_t><<<grid, kDenseThreads, 0, stream>>>(a, a.hf_hidden_bits);
  }
  return cudaGetLastError();
}

int verify_tree_cuda(const VerifyTreeArgs& a, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (a.batch == 0) return cudaSuccess;
  const size_t smem = static_cast<size_t>(a.max_nodes) * sizeof(int32_t);
  const unsigned grid = static_cast<unsigned>(a.batch);
  auto launch = [&](auto kernel) -> cudaError_t {
    if (smem > 48 * 1024) {
      const cudaError_t err = cudaFuncSetAttribute(
          kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess) return err;
    }
    kernel<<<grid, kVerifyThreads, smem, stream>>>(a);
    return cudaGetLastError();
  };
  switch (static_cast<DType>(a.dtype)) {
    case DType::kFloat32: return launch(verify_tree_kernel<float>);
    case DType::kFloat16: return launch(verify_tree_kernel<Half16>);
    case DType::kBFloat16: return launch(verify_tree_kernel<BFloat16>);
    case DType::kFloat64: return launch(verify_tree_kernel<double>);
  }
  return cudaErrorInvalidValue;
}

int compact_kv_cuda(const CompactArgs& a, char* const* caches, int64_t num_caches,
                    void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (a.batch == 0) return cudaSuccess;
  compact_validate_kernel<<<static_cast<unsigned>((a.batch + 127) / 128), 128, 0, stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || num_caches == 0) return err;
  // The widest copy unit dividing the head row, every stride and every base address.
  uint64_t align = static_cast<uint64_t>(a.row_bytes | a.stride_b | a.stride_h | a.stride_t);
  for (int64_t i = 0; i < num_caches; ++i) align |= reinterpret_cast<uintptr_t>(caches[i]);
  if (align % 16 == 0) return launch_compact<uint4>(a, caches, num_caches, stream);
  if (align % 8 == 0) return launch_compact<uint2>(a, caches, num_caches, stream);
  if (align % 4 == 0) return launch_compact<uint32_t>(a, caches, num_caches, stream);
  if (align % 2 == 0) return launch_compact<uint16_t>(a, caches, num_caches, stream);
  return launch_compact<uint8_t>(a, caches, num_caches, stream);
}

}  // namespace tree
}  // namespace specdec
