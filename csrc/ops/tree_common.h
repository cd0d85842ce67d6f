// Argument checks and kernel-argument packing shared by tree_cpu.cpp and tree_cuda.cpp.
#pragma once

#include "ops/aten.h"

#include <cstring>
#include <optional>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/tree/tree.h"

namespace specdec {
namespace tree_ops {

inline void check_vec(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t size,
                      const at::Device& device) {
  TORCH_CHECK(t.dim() == 1 && t.size(0) == size, name, ": expected shape (", size, "), got ",
              t.sizes());
  TORCH_CHECK(t.scalar_type() == dtype, name, ": expected dtype ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.device() == device, name, ": expected device ", device, ", got ", t.device());
  TORCH_CHECK(t.is_contiguous(), name, ": must be contiguous");
}

inline void check_out(const at::Tensor& t, const char* name, at::ScalarType dtype,
                      at::IntArrayRef shape, const at::Device& device) {
  TORCH_CHECK(t.sizes() == shape, name, ": expected shape ", shape, ", got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == dtype, name, ": expected dtype ", dtype, ", got ", t.scalar_type());
  TORCH_CHECK(t.device() == device, name, ": expected device ", device, ", got ", t.device());
  TORCH_CHECK(t.is_contiguous(), name, ": must be contiguous");
}

// parents: (N,) int64; cu_num_nodes: (B+1,) int64, on one device.
inline void check_tree(const at::Tensor& parents, const at::Tensor& cu) {
  TORCH_CHECK(parents.dim() == 1, "parents: expected shape (N,), got ", parents.sizes());
  TORCH_CHECK(cu.dim() == 1 && cu.size(0) >= 1, "cu_num_nodes: expected shape (B+1,), got ",
              cu.sizes());
  check_vec(parents, "parents", at::kLong, parents.size(0), parents.device());
  check_vec(cu, "cu_num_nodes", at::kLong, cu.size(0), parents.device());
}

inline int dtype_code(at::ScalarType t, const char* name) {
  switch (t) {
    case at::kFloat: return static_cast<int>(DType::kFloat32);
    case at::kHalf: return static_cast<int>(DType::kFloat16);
    case at::kBFloat16: return static_cast<int>(DType::kBFloat16);
    case at::kDouble: return static_cast<int>(DType::kFloat64);
    default: TORCH_CHECK(false, name, ": expected float32, float16, bfloat16 or float64, got ", t);
  }
  return 0;
}

inline uint64_t hidden_bits(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return 0xff7fffffull;            // -3.4028235e38
    case at::kHalf: return 0xfbffull;                 // -65504
    case at::kBFloat16: return 0xff7full;             // -3.3895e38
    case at::kDouble: return 0xffefffffffffffffull;   // -1.7976931348623157e308
    default: TORCH_CHECK(false, "hf_mask: expected a float dtype, got ", t);
  }
  return 0;
}

inline tree::BuildTreeArgs build_args(const at::Tensor& parents, const at::Tensor& cu,
                                      const at::Tensor& cache_len, int64_t max_prefix,
                                      at::Tensor& depth, at::Tensor& positions,
                                      at::Tensor& tree_mask, at::Tensor& packed_mask,
                                      at::Tensor& first_child, at::Tensor& next_sibling,
                                      const std::optional<at::Tensor>& hf_mask,
                                      at::Tensor& status) {
  check_tree(parents, cu);
  const int64_t batch = cu.size(0) - 1;
  const auto dev = parents.device();
  check_vec(cache_len, "cache_len", at::kLong, batch, dev);
  // depth, positions, first_child, next_sibling: (B, M)
  TORCH_CHECK(depth.dim() == 2 && depth.size(0) == batch && depth.size(1) >= 1,
              "depth: expected shape (B, max_nodes) with B = ", batch, ", got ", depth.sizes());
  const int64_t m = depth.size(1);
  check_out(depth, "depth", at::kLong, {batch, m}, dev);
  check_out(positions, "positions", at::kLong, {batch, m}, dev);
  check_out(first_child, "first_child", at::kLong, {batch, m}, dev);
  check_out(next_sibling, "next_sibling", at::kLong, {batch, m}, dev);
  check_out(tree_mask, "tree_mask", at::kBool, {batch, m, m}, dev);             // (B, M, M)
  check_out(packed_mask, "packed_mask", at::kByte, {batch, m, (m + 7) / 8}, dev);  // (B, M, M/8)
  check_out(status, "status", at::kInt, {batch}, dev);
  tree::BuildTreeArgs a{};
  a.parents = parents.data_ptr<int64_t>();
  a.cu = cu.data_ptr<int64_t>();
  a.cache_len = cache_len.data_ptr<int64_t>();
  a.batch = batch;
  a.num_flat = parents.size(0);
  a.max_nodes = m;
  a.depth = depth.data_ptr<int64_t>();
  a.positions = positions.data_ptr<int64_t>();
  a.tree_mask = reinterpret_cast<uint8_t*>(tree_mask.data_ptr<bool>());
  a.packed_mask = packed_mask.data_ptr<uint8_t>();
  a.first_child = first_child.data_ptr<int64_t>();
  a.next_sibling = next_sibling.data_ptr<int64_t>();
  a.status = status.data_ptr<int32_t>();
  a.hf_mask = nullptr;
  a.max_prefix = max_prefix;
  if (hf_mask.has_value()) {
    TORCH_CHECK(max_prefix >= 0, "max_prefix: must be >= 0, got ", max_prefix);
    const at::Tensor& h = *hf_mask;
    a.hf_hidden_bits = hidden_bits(h.scalar_type());
    check_out(h, "hf_mask", h.scalar_type(), {batch, 1, m, max_prefix + m}, dev);  // (B,1,M,P+M)
    a.hf_mask = h.data_ptr();
    a.hf_elem_size = static_cast<int>(h.element_size());
  }
  return a;
}

// logits: (N, V) flat or (B, M, V) padded; last dim contiguous.
inline void logits_layout(const at::Tensor& t, const char* name, int64_t batch, int64_t num_flat,
                          int64_t m, int64_t vocab, const at::Device& dev, bool& flat,
                          int64_t& row_stride, int64_t& node_stride) {
  TORCH_CHECK(t.device() == dev, name, ": expected device ", dev, ", got ", t.device());
  TORCH_CHECK(t.size(-1) == vocab && t.stride(-1) == 1, name,
              ": last dim must be the vocabulary (", vocab, ") and contiguous, got shape ",
              t.sizes(), " strides ", t.strides());
  if (t.dim() == 2) {
    TORCH_CHECK(t.size(0) == num_flat, name, ": expected shape (N, V) = (", num_flat, ", ", vocab,
                ") or (B, max_nodes, V), got ", t.sizes());
    flat = true;
    row_stride = 0;
    node_stride = t.stride(0);
  } else {
    TORCH_CHECK(t.dim() == 3 && t.size(0) == batch && t.size(1) == m, name,
                ": expected shape (N, V) or (B, max_nodes, V) = (", batch, ", ", m, ", ", vocab,
                "), got ", t.sizes());
    flat = false;
    row_stride = t.stride(0);
    node_stride = t.stride(1);
  }
}

inline tree::VerifyTreeArgs verify_args(
    const at::Tensor& draft_tokens, const at::Tensor& parents, const at::Tensor& cu,
    const at::Tensor& target_logits, const std::optional<at::Tensor>& draft_logits,
    const at::Tensor& temperature, const at::Tensor& top_k, const at::Tensor& top_p,
    const at::Tensor& seed, const at::Tensor& position, at::Tensor& tokens,
    at::Tensor& accepted_nodes, at::Tensor& num_accepted, at::Tensor& status) {
  check_tree(parents, cu);
  const auto dev = parents.device();
  const int64_t batch = cu.size(0) - 1, num_flat = parents.size(0);
  check_vec(draft_tokens, "draft_tokens", at::kLong, num_flat, dev);  // (N,)
  TORCH_CHECK(tokens.dim() == 2 && tokens.size(0) == batch && tokens.size(1) >= 1,
              "tokens: expected shape (B, max_nodes) with B = ", batch, ", got ", tokens.sizes());
  const int64_t m = tokens.size(1);
  check_out(tokens, "tokens", at::kLong, {batch, m}, dev);
  check_out(accepted_nodes, "accepted_nodes", at::kLong, {batch, m}, dev);
  check_out(num_accepted, "num_accepted", at::kLong, {batch}, dev);
  check_out(status, "status", at::kInt, {batch}, dev);
  check_vec(temperature, "temperature", at::kFloat, batch, dev);
  check_vec(top_k, "top_k", at::kInt, batch, dev);
  check_vec(top_p, "top_p", at::kFloat, batch, dev);
  check_vec(seed, "seed", at::kLong, batch, dev);
  check_vec(position, "position", at::kLong, batch, dev);
  TORCH_CHECK(target_logits.dim() >= 1 && target_logits.size(-1) >= 1,
              "target_logits: expected a non-empty vocabulary dim, got ", target_logits.sizes());
  const int64_t vocab = target_logits.size(-1);
  TORCH_CHECK(vocab < (int64_t{1} << 31), "target_logits: vocabulary too large: ", vocab);
  tree::VerifyTreeArgs a{};
  logits_layout(target_logits, "target_logits", batch, num_flat, m, vocab, dev, a.target_flat,
                a.target_row_stride, a.target_node_stride);
  a.dtype = dtype_code(target_logits.scalar_type(), "target_logits");
  a.target_logits = target_logits.data_ptr();
  a.draft_logits = nullptr;
  if (draft_logits.has_value()) {
    const at::Tensor& d = *draft_logits;
    TORCH_CHECK(d.scalar_type() == target_logits.scalar_type(), "draft_logits: expected dtype ",
                target_logits.scalar_type(), " (that of target_logits), got ", d.scalar_type());
    TORCH_CHECK(d.dim() >= 1 && d.size(-1) == vocab, "draft_logits: expected vocabulary ", vocab,
                ", got shape ", d.sizes());
    logits_layout(d, "draft_logits", batch, num_flat, m, vocab, dev, a.draft_flat,
                  a.draft_row_stride, a.draft_node_stride);
    a.draft_logits = d.data_ptr();
  }
  a.draft_tokens = draft_tokens.data_ptr<int64_t>();
  a.parents = parents.data_ptr<int64_t>();
  a.cu = cu.data_ptr<int64_t>();
  a.vocab = vocab;
  a.temperature = temperature.data_ptr<float>();
  a.top_k = top_k.data_ptr<int32_t>();
  a.top_p = top_p.data_ptr<float>();
  a.seed = seed.data_ptr<int64_t>();
  a.position = position.data_ptr<int64_t>();
  a.batch = batch;
  a.num_flat = num_flat;
  a.max_nodes = m;
  a.tokens = tokens.data_ptr<int64_t>();
  a.accepted_nodes = accepted_nodes.data_ptr<int64_t>();
  a.num_accepted = num_accepted.data_ptr<int64_t>();
  a.status = status.data_ptr<int32_t>();
  return a;
}

// caches: tensors (B, H, T, D), one dtype, one shape, one set of strides, D contiguous.
inline tree::CompactArgs compact_args(const at::TensorList caches, const at::Tensor& accepted_nodes,
                                      const at::Tensor& num_accepted, const at::Tensor& src_start,
                                      const at::Tensor& dst_start, at::Tensor& status) {
  const auto dev = accepted_nodes.device();
  TORCH_CHECK(accepted_nodes.dim() == 2, "accepted_nodes: expected shape (B, W), got ",
              accepted_nodes.sizes());
  const int64_t batch = accepted_nodes.size(0);
  check_out(accepted_nodes, "accepted_nodes", at::kLong, accepted_nodes.sizes(), dev);
  check_vec(num_accepted, "num_accepted", at::kLong, batch, dev);
  check_vec(src_start, "src_start", at::kLong, batch, dev);
  check_vec(dst_start, "dst_start", at::kLong, batch, dev);
  check_out(status, "status", at::kInt, {batch}, dev);
  tree::CompactArgs a{};
  a.accepted_nodes = accepted_nodes.data_ptr<int64_t>();
  a.num_accepted = num_accepted.data_ptr<int64_t>();
  a.src_start = src_start.data_ptr<int64_t>();
  a.dst_start = dst_start.data_ptr<int64_t>();
  a.batch = batch;
  a.width = accepted_nodes.size(1);
  a.status = status.data_ptr<int32_t>();
  if (caches.empty()) return a;
  const at::Tensor& c0 = caches[0];
  TORCH_CHECK(c0.dim() == 4 && c0.size(0) == batch, "caches[0]: expected shape (B, H, T, D) with B = ",
              batch, ", got ", c0.sizes());
  for (size_t i = 0; i < caches.size(); ++i) {
    const at::Tensor& c = caches[i];
    TORCH_CHECK(c.sizes() == c0.sizes() && c.strides() == c0.strides() &&
                    c.scalar_type() == c0.scalar_type(),
                "caches[", i, "]: every cache tensor must have the shape, strides and dtype of "
                "caches[0] (", c0.sizes(), ", ", c0.strides(), ", ", c0.scalar_type(), "), got ",
                c.sizes(), ", ", c.strides(), ", ", c.scalar_type());
    TORCH_CHECK(c.device() == dev, "caches[", i, "]: expected device ", dev, ", got ", c.device());
    TORCH_CHECK(c.stride(3) == 1, "caches[", i, "]: the head dim D must be contiguous, strides ",
                c.strides());
  }
  const int64_t es = c0.element_size();
  a.heads = c0.size(1);
  a.slots = c0.size(2);
  a.row_bytes = c0.size(3) * es;
  a.stride_b = c0.stride(0) * es;
  a.stride_h = c0.stride(1) * es;
  a.stride_t = c0.stride(2) * es;
  return a;
}

}  // namespace tree_ops
}  // namespace specdec
