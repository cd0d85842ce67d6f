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
#include "kernels/sampling/chain.h"
#include "kernels/sampling/distribution.h"
#include "kernels/tree/compact.h"
#include "kernels/tree/row_dist.h"
#include "kernels/tree/tree.h"
#include "kernels/tree/tree_walk.h"

namespace specdec {
namespace tree {

namespace {

// One row of the additive mask: prefix slots [0, visible_prefix) and the visible tree nodes get 0,
// everything else `hidden`. Bits: the element type's bit pattern (uint16_t / uint32_t / uint64_t).
template <typename Bits>
void write_hf_row(void* base, int64_t offset, int64_t max_prefix, int64_t visible_prefix,
                  const uint8_t* dense, int64_t m, uint64_t hidden_bits) {
  Bits* out = static_cast<Bits*>(base) + offset;
  const Bits hidden = static_cast<Bits>(hidden_bits);
  std::fill(out, out + visible_prefix, Bits(0));
  std::fill(out + visible_prefix, out + max_prefix, hidden);
  for (int64_t j = 0; j < m; ++j) out[max_prefix + j] = dense[j] ? Bits(0) : hidden;
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
  if (!cache_len_ok(cache_len, m, a.hf_mask != nullptr, a.max_prefix)) ok = false;
  a.status[b] = ok ? kStatusOk : kStatusMalformedTree;
  const int64_t live = ok ? n : 0;  // a malformed row is written as if it had no node

  // Ancestor bit rows: bits(v) = bits(parent) | {v}, the set the CUDA kernel walks out.
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
  // Children in index order by one backward sweep: the sibling after v is the child of v's parent
  // seen last (= next) so far; what remains per parent at the end is its first child.
  std::vector<int64_t> first(static_cast<size_t>(m), -1), sibling(static_cast<size_t>(m), -1);
  for (int64_t v = live - 1; v >= 1; --v) {
    sibling[v] = first[parents[v]];
    first[parents[v]] = v;
  }
  for (int64_t v = 0; v < m; ++v) {
    const int64_t o = b * m + v;
    a.depth[o] = depth[v];
    a.positions[o] = cache_len + (v < live ? depth[v] : 0);
    a.first_child[o] = first[v];
    a.next_sibling[o] = sibling[v];
    const uint32_t* row = bits.data() + v * words;
    uint8_t* dense = a.tree_mask + (b * m + v) * m;
    for (int64_t j = 0; j < m; ++j) dense[j] = (row[j >> 5] >> (j & 31)) & 1u;
    uint8_t* packed = a.packed_mask + (b * m + v) * packed_bytes;
    for (int64_t k = 0; k < packed_bytes; ++k) packed[k] = static_cast<uint8_t>(row[k >> 2] >> (8 * (k & 3)));
    if (a.hf_mask != nullptr) {
      const int64_t offset = (b * m + v) * (a.max_prefix + m);
      const int64_t visible_prefix = v < live ? cache_len : 0;
      switch (a.hf_elem_size) {
        case 2: write_hf_row<uint16_t>(a.hf_mask, offset, a.max_prefix, visible_prefix, dense, m, a.hf_hidden_bits); break;
        case 4: write_hf_row<uint32_t>(a.hf_mask, offset, a.max_prefix, visible_prefix, dense, m, a.hf_hidden_bits); break;
        default: write_hf_row<uint64_t>(a.hf_mask, offset, a.max_prefix, visible_prefix, dense, m, a.hf_hidden_bits);
      }
    }
  }
}

namespace {

using sampling::exp_noise;
using sampling::gumbel_noise;
using sampling::kGumbelMax;
using sampling::kInvExpNoiseMin;
using sampling::RaceBest;

// One distribution row materialised as float32 s = l / T (l itself for greedy); false when the row
// is unusable (NaN / +inf anywhere, or nothing above -inf).
template <typename T>
bool load_scaled(const T* logits, int64_t vocab, float temperature, float* s, float& max) {
  bool bad = false;
  float m = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    const float x = scaled(to_float(logits[i]), temperature);
    s[i] = x;
    bad |= bad_value(x);
    m = x > m ? x : m;
  }
  max = m;
  return !sampling::row_unusable(bad, m);
}

float sum_weights(const float* s, int64_t vocab, float threshold, float max) {
  float z = 0.0f;
  for (int64_t i = 0; i < vocab; ++i) z += weight(threshold, max, s[i]);
  return z;
}

// The filter + normaliser of a scaled row (top-k, then top-p over the top-k softmax). A race needs
// no normaliser: with need_probs false and top-p off, Z is not computed (inv_z stays 0).
RowDist make_dist(const float* s, int64_t vocab, float max, int64_t top_k, float top_p,
                  bool need_probs = true) {
  RowDist d{-INFINITY, max, 0.0f};
  if (top_k_active(top_k, vocab)) {
    d.threshold = search_threshold([&](uint32_t cand) {
      int64_t count = 0;
      for (int64_t i = 0; i < vocab; ++i) count += float_order_key(s[i]) >= cand;
      return count >= top_k;
    });
  }
  if (!need_probs && !top_p_active(top_p)) return d;
  float z = sum_weights(s, vocab, d.threshold, max);
  if (top_p_active(top_p)) {
    const float inv_z = 1.0f / z, k_threshold = d.threshold;
    const float t = search_threshold([&](uint32_t cand) {
      double mass = 0.0;
      for (int64_t i = 0; i < vocab; ++i)
        if (float_order_key(s[i]) >= cand) mass += weight(k_threshold, max, s[i]) * inv_z;
      return top_p_reached(mass, top_p);
    });
    if (t > d.threshold) {  // (a NaN t, no cut found, keeps everything)
      d.threshold = t;
      z = sum_weights(s, vocab, d.threshold, max);
    }
  }
  d.inv_z = 1.0f / z;
  return d;
}

// Gumbel race argmax_i s_i + G_i over kept tokens, pruned exactly (distribution.h's bound).
int64_t race_cpu(const float* s, const RowDist& d, int64_t vocab, const RandomStream& stream) {
  // Seed the pruning bound with the max (the element with the highest bound), as sampling does.
  int64_t first = 0;
  while (s[first] != d.max) ++first;
  RaceBest best{s[first] + gumbel_noise(stream.element(static_cast<uint32_t>(first))), first};
  for (int64_t g = 0; g < vocab; g += 4) {
    const int64_t end = g + 4 < vocab ? g + 4 : vocab;
    bool any = false;
    for (int64_t i = g; i < end; ++i) any |= kept(d, s[i]) && s[i] + kGumbelMax >= best.key;
    if (!any) continue;
    const PhiloxOut bits = stream.block(static_cast<uint32_t>(g >> 2));
    for (int64_t i = g; i < end; ++i)
      if (kept(d, s[i])) best.offer(s[i] + gumbel_noise(bits.x[i - g]), i);
  }
  return best.index;
}

// Residual race argmax_i r_i / E_i over r_i > 0, pruned exactly.
int64_t residual_race_cpu(const float* r, int64_t vocab, const RandomStream& stream) {
  RaceBest best{-INFINITY, -1};
  for (int64_t g = 0; g < vocab; g += 4) {
    const int64_t end = g + 4 < vocab ? g + 4 : vocab;
    bool any = false;
    for (int64_t i = g; i < end; ++i) any |= r[i] > 0.0f && r[i] * kInvExpNoiseMin >= best.key;
    if (!any) continue;
    const PhiloxOut bits = stream.block(static_cast<uint32_t>(g >> 2));
    for (int64_t i = g; i < end; ++i)
      if (r[i] > 0.0f) best.offer(r[i] / exp_noise(bits.x[i - g]), i);
  }
  return best.index;
}

template <typename T>
void verify_row(const VerifyTreeArgs& a, int64_t b) {
  const int64_t m = a.max_nodes, vocab = a.vocab;
  int64_t* out_tokens = a.tokens + b * m;
  int64_t* out_path = a.accepted_nodes + b * m;
  auto fail = [&](int32_t code) {
    for (int64_t j = 0; j < m; ++j) out_tokens[j] = out_path[j] = -1;
    a.num_accepted[b] = 0;
    a.status[b] = code;
  };
  fail(kStatusOk);
  const int64_t lo = a.cu[b], hi = a.cu[b + 1];
  if (!row_bounds_ok(lo, hi, a.num_flat, m)) return fail(kStatusMalformedTree);
  const int64_t n = hi - lo;
  const int64_t* parents = a.parents + lo;
  for (int64_t v = 0; v < n; ++v)
    if (!node_ok(parents, v)) return fail(kStatusMalformedTree);
  const float temperature = a.temperature[b], top_p = a.top_p[b];
  if (sampling::bad_params(temperature, top_p)) return fail(kStatusBadSamplingParams);
  const int64_t* tokens = a.draft_tokens + lo;
  for (int64_t v = 1; v < n; ++v)
    if (tokens[v] < 0 || tokens[v] >= vocab) return fail(kStatusDraftTokenOutOfRange);

  auto node_row = [&](const void* base, bool flat, int64_t row_stride, int64_t node_stride,
                      int64_t v) {
    const T* p = static_cast<const T*>(base);
    return flat ? p + (lo + v) * node_stride : p + b * row_stride + v * node_stride;
  };
  float* s = a.workspace;              // (V,) target row, scaled
  float* sd = a.workspace + vocab;     // (V,) draft row, scaled
  float* p = a.workspace + 2 * vocab;  // (V,) adjusted target probabilities, then the residual
  float* q = a.workspace + 3 * vocab;  // (V,) draft probabilities at the current node
  const uint64_t seed = static_cast<uint64_t>(a.seed[b]);
  const int64_t top_k = a.top_k[b];

  int64_t v = 0, depth = 0;
  out_path[0] = 0;
  while (true) {
    const int64_t pos = a.position[b] + depth;  // absolute position of the token decided at v
    const T* target = node_row(a.target_logits, a.target_flat, a.target_row_stride,
                               a.target_node_stride, v);
    float smax;
    if (!load_scaled(target, vocab, temperature, s, smax)) return fail(kStatusNonFiniteLogits);
    int64_t next = -1, emit = -1;
    if (temperature == 0.0f) {  // greedy: the first child equal to the argmax
      for (emit = 0; s[emit] != smax; ++emit) {
      }
      for (int64_t c = next_child(parents, n, v, v); c >= 0 && next < 0; c = next_child(parents, n, v, c))
        if (tokens[c] == emit) next = c;
    } else if (a.draft_logits == nullptr) {  // one-hot drafts: sample-and-match over the children
      const RowDist d = make_dist(s, vocab, smax, top_k, top_p, /*need_probs=*/false);
      emit = race_cpu(s, d, vocab, RandomStream(seed, pos, kPurposeSample, 0));
      for (int64_t c = next_child(parents, n, v, v); c >= 0 && next < 0; c = next_child(parents, n, v, c))
        if (tokens[c] == emit) next = c;
    } else {  // SpecInfer multi-step speculative sampling
      const RowDist d = make_dist(s, vocab, smax, top_k, top_p);
      int64_t c = next_child(parents, n, v, v);
      if (c < 0) {  // leaf: bonus token from p
        emit = race_cpu(s, d, vocab, RandomStream(seed, pos, kPurposeSample, 0));
      } else {
        const T* draft = node_row(a.draft_logits, a.draft_flat, a.draft_row_stride,
                                  a.draft_node_stride, v);
        float dmax;
        if (!load_scaled(draft, vocab, temperature, sd, dmax)) return fail(kStatusNonFiniteLogits);
        const RowDist dq = make_dist(sd, vocab, dmax, top_k, top_p);
        // p and q once per node (one exp each per token); the attempts below are then plain
        // subtract / clamp passes that vectorise.
        for (int64_t i = 0; i < vocab; ++i) {
          p[i] = prob(d, s[i]);
          q[i] = prob(dq, sd[i]);
        }
        for (uint32_t attempt = 0; c >= 0; ++attempt) {
          const int64_t x = tokens[c];
          const float u = uniform_open01(RandomStream(seed, pos, kPurposeAccept, attempt).element(0));
          if (sampling::accept_draft(u, q[x], p[x])) {
            next = c;
            break;
          }
          const int64_t later = next_child(parents, n, v, c);
          // r = max(0, p - q): the next p after normalising, or the residual to sample from
          float total = 0.0f;
          for (int64_t i = 0; i < vocab; ++i) {
            const float r = p[i] - q[i];
            total += r > 0.0f ? r : 0.0f;
          }
          if (later < 0) {  // all rejected: race over r, or over p when r is zero everywhere
            if (total > 0.0f)
              for (int64_t i = 0; i < vocab; ++i) {
                const float r = p[i] - q[i];
                p[i] = r > 0.0f ? r : 0.0f;
              }
            emit = residual_race_cpu(p, vocab, RandomStream(seed, pos, kPurposeResidual, 0));
            break;
          }
          if (total > 0.0f)  // p <- normalise(max(0, p - q)); unchanged when that is zero
            for (int64_t i = 0; i < vocab; ++i) {
              const float r = p[i] - q[i];
              p[i] = (r > 0.0f ? r : 0.0f) / total;
            }
          c = later;
        }
      }
    }
    if (next < 0) {
      out_tokens[depth] = emit;
      a.num_accepted[b] = depth;
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
    case DType::kFloat64: return verify_row<double>(a, b);
  }
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
