// Torch-free entry points of the tree family: build_tree, verify_tree, compact_kv.
// CPU kernels process one batch row per call (the glue spreads rows over threads); CUDA launchers
// process the whole batch on a stream and return a cudaError_t as int (0 = success).
//
// Shapes (B rows, M = max_nodes, N = flat node count, V = vocab):
//   parents, draft_tokens: (N,) int64, row b = [cu[b], cu[b+1])   cu: (B+1,) int64
//   depth, positions, first_child, next_sibling: (B, M) int64     tree_mask: (B, M, M) uint8 (bool)
//   packed_mask: (B, M, ceil(M/8)) uint8                          hf_mask: (B, 1, M, P + M)
//   tokens, accepted_nodes: (B, M) int64   num_accepted: (B,) int64   status: (B,) int32
#pragma once

#include <cstdint>

namespace specdec {
namespace tree {

struct BuildTreeArgs {
  const int64_t* parents;    // (N,) row-local parent indices, root -1
  const int64_t* cu;         // (B+1,) cumulative node counts
  const int64_t* cache_len;  // (B,) tokens already cached per row: the root's position
  int64_t batch, num_flat, max_nodes;
  int64_t* depth;            // (B, M) -1 padded
  int64_t* positions;        // (B, M) cache_len + depth; padded with cache_len
  uint8_t* tree_mask;        // (B, M, M) bool; padded rows see only themselves
  uint8_t* packed_mask;      // (B, M, ceil(M/8)) little-endian bits of tree_mask
  int64_t* first_child;      // (B, M) -1 when none
  int64_t* next_sibling;     // (B, M) -1 when none
  int32_t* status;           // (B,) kStatusMalformedTree for a bad row (or a bad cache_len)
  void* hf_mask;             // (B, 1, M, P + M) additive mask or nullptr
  int64_t max_prefix;        // P
  int hf_elem_size;          // bytes per hf_mask element: 2, 4 or 8
  uint64_t hf_hidden_bits;   // bit pattern of the dtype's most negative finite value
};

struct VerifyTreeArgs {
  const int64_t* draft_tokens;  // (N,) node tokens (node 0's is the committed token, unused)
  const int64_t* parents;       // (N,)
  const int64_t* cu;            // (B+1,)
  const void* target_logits;    // node v of row b at row_base(b) + v * node_stride, (V,) contiguous
  const void* draft_logits;     // same layout as target_logits or nullptr (one-hot drafts)
  int64_t target_row_stride, target_node_stride;  // elements; flat (N, V): row stride = 0
  bool target_flat;             // true: node v of row b is flat row cu[b] + v
  int64_t draft_row_stride, draft_node_stride;
  bool draft_flat;
  int dtype;                    // specdec::DType of both logit tensors
  int64_t vocab;
  const float* temperature;     // (B,) 0 = greedy
  const int32_t* top_k;         // (B,) <= 0 or >= V disables
  const float* top_p;           // (B,) 1 disables
  const int64_t* seed;          // (B,)
  const int64_t* position;      // (B,) absolute position of the token decided at the root
  int64_t batch, num_flat, max_nodes;
  int64_t* tokens;              // (B, M) -1 padded
  int64_t* accepted_nodes;      // (B, M) -1 padded, root first
  int64_t* num_accepted;        // (B,)
  int32_t* status;              // (B,)
  float* workspace;             // CPU: 4 * V floats for the row; CUDA: (B, V) floats
};

struct CompactArgs {
  const int64_t* accepted_nodes;  // (B, W) path, root first, -1 padded
  const int64_t* num_accepted;    // (B,) the row moves num_accepted + 1 slots
  const int64_t* src_start;       // (B,) cache slot of node 0
  const int64_t* dst_start;       // (B,) first destination slot (<= src_start)
  int64_t batch, width;
  int64_t heads, slots, row_bytes;  // H, T, D * element size
  int64_t stride_b, stride_h, stride_t;  // bytes, identical for every cache tensor
  int32_t* status;                 // (B,) kStatusBadCompaction: invalid request, nothing moved
};

// CPU, one row each.
void build_tree_row_cpu(const BuildTreeArgs& a, int64_t b);
void verify_tree_row_cpu(const VerifyTreeArgs& a, int64_t b);
// (compact_row_ok, the validation of one row, is in kernels/tree/compact.h.)
// Moves row b's slots in one cache tensor (base pointer of the whole [B, H, T, D] tensor).
void compact_row_cpu(const CompactArgs& a, int64_t b, char* cache);

// CUDA launchers (stream is a cudaStream_t); return a cudaError_t value.
int build_tree_cuda(const BuildTreeArgs& a, void* stream);
int verify_tree_cuda(const VerifyTreeArgs& a, void* stream);
int compact_kv_cuda(const CompactArgs& a, char* const* caches, int64_t num_caches, void* stream);

}  // namespace tree
}  // namespace specdec
