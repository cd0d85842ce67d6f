// DDTree (Ringel & Romano 2026): the best draft tree under a node budget, built from a block
// drafter's per-depth top-K log-probabilities.
//
// The draft distribution factorises over depths (DFlash gives one q_d per block position), so a
// prefix (t_1 .. t_d) has log-probability sum_i lp[i][rank_i]. Best-first search over the implicit
// tree whose node (d, r) under a prefix is that prefix extended by the rank-r token of depth d:
// pop the most probable prefix, make it a node, push its next sibling (same parent, rank r + 1)
// and its first child (depth d + 1, rank 0); stop at `budget` nodes. With log-probs <= 0 and
// ranks sorted, every pushed prefix is no more probable than the one popped, so the popped set
// is the `budget` most probable prefixes: the tree of the largest expected accepted length.
// Ties pop in push order (a push counter), which the Python reference reproduces exactly; scores
// are summed in double on both sides, in the same order.
//
// Output order is BFS (children of a node in rank order), as Draft.parents wants.
//
// Shapes (B rows, D depths, K candidates per depth, M = budget):
//   topk_logprobs: (B, D, K) float32     topk_tokens: (B, D, K) int64     max_depth: (B,) int64
//   tokens, parents, depth: (B, M) int64 (node j = draft node j; parents: 0 = root, i + 1 = node i)
//   num_nodes: (B,) int64      tree_mask: (B, M + 1, M + 1) uint8, entry (i, j): node j is node i
//   or one of its ancestors (index 0 = root)      status: (B,) int32
// Padding: tokens 0, parents 0, depth -1; padded mask rows see only themselves.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/common/hd.h"
#include "kernels/common/status.h"

namespace specdec {
namespace ddtree {

struct BuildArgs {
  const float* topk_logprobs;  // (B, D, K) contiguous, candidates of a depth sorted descending
  const int64_t* topk_tokens;  // (B, D, K) contiguous
  const int64_t* max_depth;    // (B,) deepest node a row may have (clamped to D; <= 0: no nodes)
  int64_t batch, depths, width, budget;  // B, D, K, M
  int64_t* tokens;             // (B, M)
  int64_t* parents;            // (B, M)
  int64_t* depth;              // (B, M)
  int64_t* num_nodes;          // (B,)
  uint8_t* tree_mask;          // (B, M + 1, M + 1)
  int32_t* status;             // (B,) kStatusNonFiniteLogits: NaN / +inf among the row's log-probs
  double* heap_scores;         // workspace (B, 2 * (M + 1)): heap score, then the parent's score
  int32_t* heap_ints;          // workspace (B, kHeapInts * (M + 1))
};

// int32 workspace lanes per slot: heap (seq, depth, rank, parent) and nodes in pop order
// (parent, depth, rank, first child, last child, next sibling, BFS index, BFS order).
constexpr int kHeapInts = 12;

struct RowWork {
  double* score;     // heap: prefix score
  double* pscore;    // heap: the parent prefix's score
  int32_t* seq;      // heap: push counter (tie-break)
  int32_t* hdepth;   // heap: depth 1..D
  int32_t* hrank;    // heap: rank 0..K-1
  int32_t* hparent;  // heap: parent node (pop index), -1 = root
  int32_t* parent;   // nodes: parent pop index, -1 root
  int32_t* ndepth;   // nodes: depth
  int32_t* nrank;    // nodes: rank
  int32_t* first;    // nodes + root (slot M): first child (pop index), -1 none
  int32_t* last;     // nodes + root: last child
  int32_t* next;     // nodes: next sibling
  int32_t* bfs_index;  // nodes: output index
  int32_t* order;      // output index -> pop index
};

// One row's workspace laid out on `scores` (2 * n doubles) and `ints` (kHeapInts * n), n = M + 1.
SPECDEC_HD RowWork row_work_at(double* scores, int32_t* ints, int64_t n) {
  RowWork w;
  w.score = scores;
  w.pscore = scores + n;
  int32_t** lanes[kHeapInts] = {&w.seq, &w.hdepth, &w.hrank, &w.hparent, &w.parent, &w.ndepth,
                                &w.nrank, &w.first, &w.last, &w.next, &w.bfs_index, &w.order};
  for (int i = 0; i < kHeapInts; ++i) *lanes[i] = ints + i * n;
  return w;
}

// Row b's slice of the global workspace.
SPECDEC_HD RowWork row_work(const BuildArgs& a, int64_t b) {
  const int64_t n = a.budget + 1;
  return row_work_at(a.heap_scores + b * 2 * n, a.heap_ints + b * kHeapInts * n, n);
}

// Heap slot x pops before slot y: higher score, then earlier push.
SPECDEC_HD bool heap_before(const RowWork& w, int64_t x, int64_t y) {
  return w.score[x] > w.score[y] || (w.score[x] == w.score[y] && w.seq[x] < w.seq[y]);
}

SPECDEC_HD void heap_swap(const RowWork& w, int64_t x, int64_t y) {
  double s = w.score[x]; w.score[x] = w.score[y]; w.score[y] = s;
  s = w.pscore[x]; w.pscore[x] = w.pscore[y]; w.pscore[y] = s;
  int32_t* lanes[4] = {w.seq, w.hdepth, w.hrank, w.hparent};
  for (int i = 0; i < 4; ++i) {
    const int32_t t = lanes[i][x]; lanes[i][x] = lanes[i][y]; lanes[i][y] = t;
  }
}

SPECDEC_HD void heap_push(const RowWork& w, int64_t& size, int32_t& counter, double score,
                          double pscore, int32_t d, int32_t r, int32_t parent) {
  int64_t x = size++;
  w.score[x] = score; w.pscore[x] = pscore; w.seq[x] = counter++;
  w.hdepth[x] = d; w.hrank[x] = r; w.hparent[x] = parent;
  while (x > 0) {  // sift up
    const int64_t up = (x - 1) / 2;
    if (!heap_before(w, x, up)) break;
    heap_swap(w, x, up);
    x = up;
  }
}

SPECDEC_HD void heap_pop(const RowWork& w, int64_t& size) {
  heap_swap(w, 0, --size);  // the top moves to slot `size`, where the caller reads it
  int64_t x = 0;
  for (;;) {  // sift down
    const int64_t l = 2 * x + 1, r = l + 1;
    int64_t best = x;
    if (l < size && heap_before(w, l, best)) best = l;
    if (r < size && heap_before(w, r, best)) best = r;
    if (best == x) break;
    heap_swap(w, x, best);
    x = best;
  }
}

// The search and the BFS numbering of row b (one thread) on workspace `w`. Returns the node count
// (-1: bad row).
SPECDEC_HD int64_t build_row(const BuildArgs& a, int64_t b, const RowWork& w) {
  const int64_t D = a.depths, K = a.width, M = a.budget;
  const float* lp = a.topk_logprobs + b * D * K;
  const int64_t* tok = a.topk_tokens + b * D * K;
  int64_t limit = a.max_depth[b];
  limit = limit < 0 ? 0 : (limit > D ? D : limit);
  for (int64_t i = 0; i < limit * K; ++i) {
    if (std::isnan(lp[i]) || (std::isinf(lp[i]) && lp[i] > 0)) return -1;
  }
  w.first[M] = w.last[M] = -1;
  int64_t size = 0, count = 0;
  int32_t counter = 0;
  if (limit > 0 && K > 0 && M > 0) heap_push(w, size, counter, double(lp[0]), 0.0, 1, 0, -1);
  while (size > 0 && count < M) {
    heap_pop(w, size);
    const double score = w.score[size], pscore = w.pscore[size];
    const int32_t d = w.hdepth[size], r = w.hrank[size], par = w.hparent[size];
    const int32_t node = static_cast<int32_t>(count++);
    w.parent[node] = par; w.ndepth[node] = d; w.nrank[node] = r;
    w.first[node] = w.last[node] = w.next[node] = -1;
    const int64_t ps = par < 0 ? M : par;  // link as the parent's last child (ranks pop in order)
    if (w.last[ps] < 0) w.first[ps] = node; else w.next[w.last[ps]] = node;
    w.last[ps] = node;
    if (count == M) break;  // nothing pushed now can be popped
    if (r + 1 < K) heap_push(w, size, counter, pscore + double(lp[(d - 1) * K + r + 1]), pscore, d, r + 1, par);
    if (d < limit) heap_push(w, size, counter, score + double(lp[d * K]), score, d + 1, 0, node);
  }
  // BFS: the root's children, then each output node's children, in rank order.
  int64_t tail = 0;
  for (int32_t c = w.first[M]; c >= 0; c = w.next[c]) w.order[tail++] = c;
  for (int64_t head = 0; head < tail; ++head) {
    const int32_t v = w.order[head];
    w.bfs_index[v] = static_cast<int32_t>(head);
    for (int32_t c = w.first[v]; c >= 0; c = w.next[c]) w.order[tail++] = c;
  }
  for (int64_t j = 0; j < count; ++j) {
    const int32_t v = w.order[j];
    const int64_t d = w.ndepth[v];
    a.tokens[b * M + j] = tok[(d - 1) * K + w.nrank[v]];
    a.parents[b * M + j] = w.parent[v] < 0 ? 0 : int64_t(w.bfs_index[w.parent[v]]) + 1;
    a.depth[b * M + j] = d;
  }
  return count;
}

// Padding of row b past `count` nodes (all of it when count <= 0), and its count and status.
SPECDEC_HD void finish_row(const BuildArgs& a, int64_t b, int64_t count) {
  const int64_t M = a.budget;
  a.status[b] = count < 0 ? kStatusNonFiniteLogits : kStatusOk;
  if (count < 0) count = 0;
  a.num_nodes[b] = count;
  for (int64_t j = count; j < M; ++j) {
    a.tokens[b * M + j] = 0;
    a.parents[b * M + j] = 0;
    a.depth[b * M + j] = -1;
  }
}

// Mask row i (0 = root, i = draft node i - 1) of row b, already zeroed: itself and its ancestors.
// Needs row b's parents and num_nodes written; rows are independent (the CUDA kernel zeroes the
// whole mask with coalesced stores, then spreads rows over threads).
SPECDEC_HD void mark_ancestors(const BuildArgs& a, int64_t b, int64_t i) {
  const int64_t M = a.budget, n = M + 1;
  uint8_t* row = a.tree_mask + (b * n + i) * n;
  row[i] = 1;
  if (i == 0 || i > a.num_nodes[b]) return;  // root, padding: only themselves
  row[0] = 1;
  // parents[j] <= j, so the walk is at most i steps.
  for (int64_t v = a.parents[b * M + i - 1]; v > 0; v = a.parents[b * M + v - 1]) row[v] = 1;
}

// CPU: one row per call (the glue spreads rows over threads).
void build_row_cpu(const BuildArgs& a, int64_t b);
// CUDA: the whole batch on a stream (cudaStream_t); returns a cudaError_t value.
int build_cuda(const BuildArgs& a, void* stream);

}  // namespace ddtree
}  // namespace specdec
