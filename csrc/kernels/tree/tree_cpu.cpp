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
#include "kernels/sampling/filter.h"
#include "kernels/sampling/row_cpu.h"
#include "kernels/tree/compact.h"
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

using sampling::RowDist;
using sampling::cpu::build_dist;
using sampling::cpu::decode_row;
using sampling::cpu::offset_pointer;
using sampling::cpu::race;
using sampling::cpu::residual_race;

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

  const DType dtype = static_cast<DType>(a.dtype);
  auto node_row = [&](const void* base, bool flat, int64_t row_stride, int64_t node_stride,
                      int64_t v) {
    return offset_pointer(base, dtype,
                          flat ? (lo + v) * node_stride : b * row_stride + v * node_stride);
  };
  float* s = a.workspace;              // (V,) target row, scaled
  float* sd = a.workspace + vocab;     // (V,) draft row, scaled
  float* p = a.workspace + 2 * vocab;  // (V,) adjusted target probabilities, then the residual
  float* q = a.workspace + 3 * vocab;  // (V,) draft probabilities at the current node
  std::vector<float> scratch;          // candidate lists of the threshold selects
  const uint64_t seed = static_cast<uint64_t>(a.seed[b]);
  const int64_t top_k = a.top_k[b];

  int64_t v = 0, depth = 0;
  out_path[0] = 0;
  while (true) {
    const int64_t pos = a.position[b] + depth;  // absolute position of the token decided at v
    const void* target = node_row(a.target_logits, a.target_flat, a.target_row_stride,
                                  a.target_node_stride, v);
    // s = float(l) / T, or l itself for greedy; every unusable row gives status 1 before use
    decode_row(target, dtype, vocab, temperature > 0.0f ? temperature : 1.0f, s);
    int64_t next = -1, emit = -1;
    RowDist d;
    if (temperature == 0.0f) {  // greedy: the first child equal to the argmax
      const sampling::cpu::RowScan scan = sampling::cpu::scan_row(s, vocab);
      if (sampling::row_unusable(scan.bad, scan.max)) return fail(kStatusNonFiniteLogits);
      emit = sampling::cpu::first_index_of(s, vocab, scan.max);
      for (int64_t c = next_child(parents, n, v, v); c >= 0 && next < 0; c = next_child(parents, n, v, c))
        if (tokens[c] == emit) next = c;
    } else if (a.draft_logits == nullptr) {  // one-hot drafts: sample-and-match over the children
      if (!build_dist(s, vocab, top_k, top_p, /*need_probs=*/false, d, nullptr, scratch)) {
        return fail(kStatusNonFiniteLogits);
      }
      emit = race(s, vocab, d, RandomStream(seed, pos, kPurposeSample, 0));
      for (int64_t c = next_child(parents, n, v, v); c >= 0 && next < 0; c = next_child(parents, n, v, c))
        if (tokens[c] == emit) next = c;
    } else {  // SpecInfer multi-step speculative sampling
      if (!build_dist(s, vocab, top_k, top_p, /*need_probs=*/true, d, nullptr, scratch)) {
        return fail(kStatusNonFiniteLogits);
      }
      int64_t c = next_child(parents, n, v, v);
      if (c < 0) {  // leaf: bonus token from p
        emit = race(s, vocab, d, RandomStream(seed, pos, kPurposeSample, 0));
      } else {
        const void* draft = node_row(a.draft_logits, a.draft_flat, a.draft_row_stride,
                                     a.draft_node_stride, v);
        decode_row(draft, dtype, vocab, temperature, sd);
        RowDist dq;
        if (!build_dist(sd, vocab, top_k, top_p, /*need_probs=*/true, dq, nullptr, scratch)) {
          return fail(kStatusNonFiniteLogits);
        }
        // p and q once per node (one exp each per token); the attempts below are then plain
        // subtract / clamp passes that vectorise.
        for (int64_t i = 0; i < vocab; ++i) {
          p[i] = sampling::prob(d, s[i]);
          q[i] = sampling::prob(dq, sd[i]);
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
            float rmax = 0.0f;
            for (int64_t i = 0; i < vocab; ++i) {
              const float r = p[i] - q[i];
              if (total > 0.0f) p[i] = r > 0.0f ? r : 0.0f;
              rmax = p[i] > rmax ? p[i] : rmax;
            }
            emit = residual_race(p, vocab, rmax, RandomStream(seed, pos, kPurposeResidual, 0));
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

void verify_tree_row_cpu(const VerifyTreeArgs& a, int64_t b) { verify_row(a, b); }

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
