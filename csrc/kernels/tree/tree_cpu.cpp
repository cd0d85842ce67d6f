// CPU kernels of the tree family, one batch row per call (torch-free; the glue in
// csrc/ops/tree_cpu.cpp spreads rows over threads). Per-element logic comes from the shared
// headers, so these loops compute what the CUDA kernels compute.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/common/philox.h"
#include "kernels/common/status.h"
#include "kernels/tree/row_dist.h"
#include "kernels/tree/tree.h"
#include "kernels/tree/tree_walk.h"

namespace specdec {
namespace tree {

namespace {

void write_hf(void* base, int64_t index, int elem_size, uint64_t bits) {
  char* p = static_cast<char*>(base) + index * elem_size;
  if (elem_size == 2) {
    const uint16_t v = static_cast<uint16_t>(bits);
    std::memcpy(p, &v, 2);
  } else if (elem_size == 4) {
    const uint32_t v = static_cast<uint32_t>(bits);
    std::memcpy(p, &v, 4);
  } else {
    std::memcpy(p, &bits, 8);
  }
}

}  // namespace

void build_tree_row_cpu(const BuildTreeArgs& a, int64_t b) {
  const int64_t m = a.max_nodes, words = (m + 31) / 32, packed_bytes = (m + 7) / 8;
  const int64_t lo = a.cu[b], hi = a.cu[b + 1];
  const int64_t cache_len = a.cache_len[b];
  bool ok = row_bounds_ok(lo, hi, a.num_flat, m);
  const int64_t n = ok ? hi - lo : 0;
  const int64_t* parents = a.parents + (ok ? lo : 0);
  for (int64_t v = 0; ok && v < n; ++v) ok = node_ok(parents, v);
  if (a.hf_mask != nullptr && !(cache_len >= 0 && cache_len <= a.max_prefix)) ok = false;
  a.status[b] = ok ? kStatusOk : kStatusMalformedTree;
  const int64_t live = ok ? n : 0;  // a malformed row is written as if it had no node

  // Ancestor bit rows: bits(v) = bits(parent) | {v}, the same set ancestor_bits() walks out.
  std::vector<uint32_t> bits(static_cast<size_t>(m * words), 0u);
  std::vector<int64_t> depth(static_cast<size_t>(m), -1);
  for (int64_t v = 0; v < m; ++v) {
    uint32_t* row = bits.data() + v * words;
    if (v < live) {
      const int64_t p = parents[v];
      if (p >= 0) {
        std::memcpy(row, bits.data() + p * words, words * sizeof(uint32_t));
        depth[v] = depth[p] + 1;
      } else {
        depth[v] = 0;
      }
    }
    row[v >> 5] |= 1u << (v & 31);  // padded rows see only themselves
  }
  for (int64_t v = 0; v < m; ++v) {
    const int64_t o = b * m + v;
    a.depth[o] = depth[v];
    a.positions[o] = cache_len + (v < live ? depth[v] : 0);
    a.first_child[o] = v < live ? next_child(parents, live, v, v) : -1;
    a.next_sibling[o] = v < live ? next_sibling(parents, live, v) : -1;
    const uint32_t* row = bits.data() + v * words;
    uint8_t* dense = a.tree_mask + (b * m + v) * m;
    for (int64_t j = 0; j < m; ++j) dense[j] = (row[j >> 5] >> (j & 31)) & 1u;
    uint8_t* packed = a.packed_mask + (b * m + v) * packed_bytes;
    for (int64_t k = 0; k < packed_bytes; ++k) packed[k] = static_cast<uint8_t>(row[k >> 2] >> (8 * (k & 3)));
    if (a.hf_mask != nullptr) {
      const int64_t width = a.max_prefix + m;
      const int64_t base = (b * m + v) * width;
      const int64_t visible_prefix = v < live ? cache_len : 0;
      for (int64_t j = 0; j < width; ++j) {
        const bool visible = j < a.max_prefix ? j < visible_prefix : dense[j - a.max_prefix] != 0;
        write_hf(a.hf_mask, base + j, a.hf_elem_size, visible ? 0ull : a.hf_hidden_bits);
      }
    }
  }
}

namespace {

// One distribution row materialised as float32 s = l / T (or l itself for greedy).
template <typename T>
RowFlags load_scaled(const T* logits, int64_t vocab, float temperature, float* s) {
  RowFlags flags{false, true};
  for (int64_t i = 0; i < vocab; ++i) {
    const float x = to_float(logits[i]);
    s[i] = temperature > 0.0f ? x / temperature : x;
    flags = flags_combine(flags, flags_of(s[i]));
  }
  return flags;
}

// Bitwise search for the largest key K with pred(K) (see row_dist.h); returns the float value.
template <typename Pred>
float search_threshold(Pred pred) {
  uint32_t key = 0;
  for (int bit = 31; bit >= 0; --bit) {
    const uint32_t cand = key | (1u << bit);
    if (pred(cand)) key = cand;
  }
  return float_from_order_key(key);
}

// The filter + normaliser of a scaled row (top-k then top-p, as the reference).
RowDist make_dist(const float* s, int64_t vocab, int64_t top_k, float top_p) {
  RowDist d{neg_inf(), neg_inf(), 0.0f};
  float mx = neg_inf();
  for (int64_t i = 0; i < vocab; ++i) mx = std::max(mx, s[i]);
  d.max = mx;
  if (top_k_active(top_k, vocab)) {
    d.threshold = search_threshold([&](uint32_t cand) {
      int64_t count = 0;
      for (int64_t i = 0; i < vocab; ++i) count += float_order_key(s[i]) >= cand;
      return count >= top_k;
    });
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < vocab; ++i) sum += kept(d, s[i]) ? expf(s[i] - mx) : 0.0f;
  d.sum = sum;
  if (top_p_active(top_p)) {
    const float target = top_p * sum;
    const float k_threshold = d.threshold;
    const float t = search_threshold([&](uint32_t cand) {
      float mass = 0.0f;
      for (int64_t i = 0; i < vocab; ++i)
        if (s[i] >= k_threshold && float_order_key(s[i]) >= cand) mass += expf(s[i] - mx);
      return mass >= target;
    });
    if (t > d.threshold) {
      d.threshold = t;
      sum = 0.0f;
      for (int64_t i = 0; i < vocab; ++i) sum += kept(d, s[i]) ? expf(s[i] - mx) : 0.0f;
      d.sum = sum;
    }
  }
  return d;
}

int64_t race_cpu(const float* s, const RowDist& d, int64_t vocab, const RandomStream& stream) {
  ArgMax best{neg_inf(), -1};
  for (int64_t i = 0; i < vocab; ++i)
    best = argmax_combine(best, {gumbel_key(s[i], kept(d, s[i]), stream.element(static_cast<uint32_t>(i))), i});
  return best.index;
}

template <typename T>
void verify_row(const VerifyTreeArgs& a, int64_t b) {
  const int64_t m = a.max_nodes, vocab = a.vocab;
  int64_t* out_tokens = a.tokens + b * m;
  int64_t* out_path = a.accepted_nodes + b * m;
  for (int64_t j = 0; j < m; ++j) out_tokens[j] = out_path[j] = -1;
  a.num_accepted[b] = 0;
  const int64_t lo = a.cu[b], hi = a.cu[b + 1];
  auto fail = [&](int32_t code) {
    for (int64_t j = 0; j < m; ++j) out_tokens[j] = out_path[j] = -1;
    a.num_accepted[b] = 0;
    a.status[b] = code;
  };
  if (!row_bounds_ok(lo, hi, a.num_flat, m)) return fail(kStatusMalformedTree);
  const int64_t n = hi - lo;
  const int64_t* parents = a.parents + lo;
  for (int64_t v = 0; v < n; ++v)
    if (!node_ok(parents, v)) return fail(kStatusMalformedTree);
  const float temperature = a.temperature[b], top_p = a.top_p[b];
  if (!(temperature >= 0.0f) || !(top_p > 0.0f && top_p <= 1.0f)) return fail(kStatusBadSamplingParams);
  const int64_t* tokens = a.draft_tokens + lo;
  for (int64_t v = 1; v < n; ++v)
    if (tokens[v] < 0 || tokens[v] >= vocab) return fail(kStatusDraftTokenOutOfRange);

  auto node_row = [&](const void* base, bool flat, int64_t row_stride, int64_t node_stride, int64_t v) {
    const T* p = static_cast<const T*>(base);
    return flat ? p + (lo + v) * node_stride : p + b * row_stride + v * node_stride;
  };
  float* s = a.workspace;              // target row, scaled
  float* sd = a.workspace + vocab;     // draft row, scaled
  float* p = a.workspace + 2 * vocab;  // current (adjusted) target probabilities
  const uint64_t seed = static_cast<uint64_t>(a.seed[b]);
  const int64_t top_k = a.top_k[b];

  int64_t v = 0, depth = 0;
  out_path[0] = 0;
  while (true) {
    const int64_t pos = a.position[b] + depth;  // absolute position of the token decided at v
    const T* target = node_row(a.target_logits, a.target_flat, a.target_row_stride, a.target_node_stride, v);
    if (flags_unusable(load_scaled(target, vocab, temperature, s))) return fail(kStatusNonFiniteLogits);
    int64_t next = -1, emit = -1;
    if (temperature == 0.0f) {  // greedy: first child equal to the argmax
      ArgMax best{neg_inf(), -1};
      for (int64_t i = 0; i < vocab; ++i) best = argmax_combine(best, {s[i], i});
      for (int64_t c = next_child(parents, n, v, v); c >= 0; c = next_child(parents, n, v, c))
        if (tokens[c] == best.index) { next = c; break; }
      emit = best.index;
    } else if (a.draft_logits == nullptr) {  // one-hot drafts: sample-and-match over the children
      const RowDist d = make_dist(s, vocab, top_k, top_p);
      const int64_t y = race_cpu(s, d, vocab, RandomStream(seed, pos, kPurposeSample, 0));
      for (int64_t c = next_child(parents, n, v, v); c >= 0; c = next_child(parents, n, v, c))
        if (tokens[c] == y) { next = c; break; }
      emit = y;
    } else {  // SpecInfer multi-step speculative sampling
      const RowDist d = make_dist(s, vocab, top_k, top_p);
      int64_t c = next_child(parents, n, v, v);
      if (c < 0) {
        emit = race_cpu(s, d, vocab, RandomStream(seed, pos, kPurposeSample, 0));
      } else {
        const T* draft = node_row(a.draft_logits, a.draft_flat, a.draft_row_stride, a.draft_node_stride, v);
        if (flags_unusable(load_scaled(draft, vocab, temperature, sd))) return fail(kStatusNonFiniteLogits);
        const RowDist dq = make_dist(sd, vocab, top_k, top_p);
        for (int64_t i = 0; i < vocab; ++i) p[i] = prob(d, s[i]);
        for (uint32_t attempt = 0; c >= 0; ++attempt) {
          const int64_t x = tokens[c];
          const float u = uniform_open01(RandomStream(seed, pos, kPurposeAccept, attempt).element(0));
          if (u * prob(dq, sd[x]) < p[x]) { next = c; break; }
          const int64_t later = next_child(parents, n, v, c);
          if (later < 0) {  // all rejected: race over max(0, p - q), or p when that is zero
            const RandomStream stream(seed, pos, kPurposeResidual, 0);
            bool any = false;
            for (int64_t i = 0; i < vocab && !any; ++i) any = p[i] - prob(dq, sd[i]) > 0.0f;
            ArgMax best{-1.0f, -1};
            for (int64_t i = 0; i < vocab; ++i) {
              const float r = any ? std::max(p[i] - prob(dq, sd[i]), 0.0f) : p[i];
              best = argmax_combine(best, {residual_key(r, stream.element(static_cast<uint32_t>(i))), i});
            }
            emit = best.index;
            break;
          }
          float total = 0.0f;  // p <- normalise(max(0, p - q)); unchanged when that is zero
          for (int64_t i = 0; i < vocab; ++i) total += std::max(p[i] - prob(dq, sd[i]), 0.0f);
          if (total > 0.0f)
            for (int64_t i = 0; i < vocab; ++i) p[i] = std::max(p[i] - prob(dq, sd[i]), 0.0f) / total;
          c = later;
        }
      }
    }
    if (next < 0) {
      out_tokens[depth] = emit;
      a.num_accepted[b] = depth;
      a.status[b] = kStatusOk;
      return;
    }
    out_tokens[depth] = tokens[next];
    out_path[depth + 1] = next;
    v = next;
    ++depth;
  }
}

}  // namespace

void verify_tree_row_cpu(const VerifyTreeArgs& a, int64_t b) {
  switch (static_cast<DType>(a.dtype)) {
    case DType::kFloat32: return verify_row<float>(a, b);
    case DType::kFloat16: return verify_row<Half16>(a, b);
    case DType::kBFloat16: return verify_row<BFloat16>(a, b);
    default: a.status[b] = kStatusBadSamplingParams;
  }
}

bool compact_row_ok(const CompactArgs& a, int64_t b) {
  const int64_t* path = a.accepted_nodes + b * a.width;
  a.status[b] = 1;
  if (a.width < 1 || path[0] < 0) {  // a row verify_tree flagged: nothing to move
    a.status[b] = 0;
    return false;
  }
  const int64_t len = a.num_accepted[b] + 1, src = a.src_start[b], dst = a.dst_start[b];
  if (len < 1 || len > a.width || dst < 0 || dst > src) return false;
  for (int64_t j = 1; j < len; ++j)
    if (path[j] <= path[j - 1]) return false;
  // Strictly increasing from path[0] >= 0 gives path[j] >= j; with dst <= src every destination
  // dst + j <= src + path[j], so an in-order copy never overwrites a slot it has yet to read.
  if (src + path[len - 1] >= a.slots || dst + len - 1 >= a.slots) return false;
  a.status[b] = 0;
  return true;
}

void compact_row_cpu(const CompactArgs& a, int64_t b, char* cache) {
  const int64_t* path = a.accepted_nodes + b * a.width;
  const int64_t len = a.num_accepted[b] + 1, src = a.src_start[b], dst = a.dst_start[b];
  for (int64_t h = 0; h < a.heads; ++h) {
    char* head = cache + b * a.stride_b + h * a.stride_h;
    for (int64_t j = 0; j < len; ++j) {  // in order: see compact_row_ok
      if (src + path[j] == dst + j) continue;
      std::memcpy(head + (dst + j) * a.stride_t, head + (src + path[j]) * a.stride_t, a.row_bytes);
    }
  }
}

}  // namespace tree
}  // namespace specdec
