// CPU glue of the `dflash` family: the DFlash drafter's two steps on its packed CPU path, each as
// one op. dflash_block_topk, a draft: the anchors' embeddings go into the block's row 0, each
// drafter layer runs as the decoder_layer op computes it (over the drafter's cache, the block
// seeing itself whole), then the LM head's top-k over the drafted positions, as log-probabilities
// and token ids of the target's vocabulary. dflash_extend, the committed tokens' context: the
// target's hidden states concatenated, context_kv, the cache's lengths advanced.
// Why one op each: in a decoding run each small torch call between those kernels (rope slices,
// the embedding gather, the hidden states' concatenation, the log-sum-exp subtraction, the draft
// vocabulary's id lookup, the outputs' allocations) found the dispatcher cold after the target's
// forward, ~10-25 us each: a third of a zoo DDTree block and half of its extend on a Zen 4 EPYC.
// Reference: DFlashDrafter's torch path (models/dflash.py: draft then log_softmax and topk;
// context_features and context_kv). CPU only: a CUDA drafter runs as torch ops.
#include "ops/aten.h"
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>

#include "ops/decoder_layer_cpu.h"
#include "ops/mtp_cpu.h"

namespace specdec::ops {
namespace {

constexpr const char* kOp = "dflash_block_topk";
// Per drafter layer, in this order: norm1, norm2, qkv_w, qkv_b, o_w, o_b, gate_up_w, gate_up_b,
// down_w, down_b, q_norm, k_norm (the decoder_layer op's weights; biases and q/k norms may be None).
constexpr int64_t kLayerArgs = 12;
constexpr int64_t kRequired[] = {0, 1, 2, 4, 6, 8};

void check_f32_2d(const at::Tensor& t, const char* name, const char* op = kOp) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.dim() == 2 && t.is_contiguous(), op, ": ", name,
              " must be a contiguous float32 2-d tensor; got ", t.scalar_type(), " ", t.sizes());
}

// The RoPE of each row's n positions lengths[b] + i, gathered from the (P, D) tables of cos and
// signed sin: two contiguous (B, n, D) float32 tensors. Checks the tables and that every position
// lies in them.
std::pair<at::Tensor, at::Tensor> rope_rows(const char* op, const at::Tensor& rope_cos, const at::Tensor& rope_sin,
                                            const int64_t* len, int64_t B, int64_t n, int64_t D) {
  check_f32_2d(rope_cos, "rope_cos", op);
  check_f32_2d(rope_sin, "rope_sin", op);
  TORCH_CHECK(rope_cos.size(1) == D && rope_sin.sizes() == rope_cos.sizes(), op, ": rope tables ", rope_cos.sizes(),
              " / ", rope_sin.sizes(), " must be [positions, ", D, "]");
  const int64_t P = rope_cos.size(0);
  at::Tensor cos = at::empty({B, n, D}, rope_cos.options()), sin = at::empty({B, n, D}, rope_cos.options());
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(len[b] >= 0 && len[b] + n <= P, op, ": row ", b, "'s positions ", len[b], " .. ", len[b] + n - 1,
                " are past the rope tables' ", P);
    std::memcpy(cos.data_ptr<float>() + b * n * D, rope_cos.data_ptr<float>() + len[b] * D, sizeof(float) * n * D);
    std::memcpy(sin.data_ptr<float>() + b * n * D, rope_sin.data_ptr<float>() + len[b] * D, sizeof(float) * n * D);
  }
  return {cos, sin};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> dflash_block_topk_cpu(
    const at::Tensor& anchors, const at::Tensor& embed, at::Tensor& block, const at::Tensor& rope_cos,
    const at::Tensor& rope_sin, const c10::List<std::optional<at::Tensor>>& layers, double norm_eps,
    at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& lengths, int64_t num_heads, double sm_scale,
    int64_t depth, const at::Tensor& final_norm, const at::Tensor& head, int64_t vocab_size,
    const std::optional<at::Tensor>& vocab_ids, int64_t k, bool log_probs) {
  // block (B, n, H) float32: rows 1 .. n - 1 hold the MASK embedding, row 0 is written here;
  // anchors (B,) int64 ids into embed (V_e, H) float32; rope_cos / rope_sin (P, D) float32, the
  // tables of positions 0 .. P - 1 (signed sin); k_caches / v_caches: per layer (B, Hkv, T, D);
  // lengths (B,) int64; head: packed panels of the LM head over vocab_size rows, vocab_ids
  // (vocab_size,) int64 their token ids or None (row j is token j).
  TORCH_CHECK(block.scalar_type() == at::kFloat && block.dim() == 3 && block.is_contiguous() && block.size(1) >= 2,
              kOp, ": block must be a contiguous float32 [B, n, hidden] tensor, n >= 2; got ", block.scalar_type(),
              " ", block.sizes());
  const int64_t B = block.size(0), n = block.size(1), H = block.size(2);
  TORCH_CHECK(depth >= 1 && depth <= n - 1, kOp, ": depth must lie in [1, n - 1 = ", n - 1, "]; got ", depth);
  TORCH_CHECK(anchors.scalar_type() == at::kLong && anchors.is_contiguous() && anchors.sizes() == at::IntArrayRef{B},
              kOp, ": anchors must be a contiguous int64 [", B, "] tensor; got ", anchors.scalar_type(), " ",
              anchors.sizes());
  check_f32_2d(embed, "embed");
  TORCH_CHECK(embed.size(1) == H, kOp, ": embed ", embed.sizes(), " does not fit hidden size ", H);
  const int64_t L = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(L >= 1 && static_cast<int64_t>(v_caches.size()) == L &&
                  static_cast<int64_t>(layers.size()) == kLayerArgs * L,
              kOp, ": ", k_caches.size(), " k caches, ", v_caches.size(), " v caches and ", layers.size(),
              " layer weights do not make layers of ", kLayerArgs, " weights each");
  for (int64_t l = 0; l < L; ++l)
    for (int64_t j : kRequired)
      TORCH_CHECK(layers.get(l * kLayerArgs + j).has_value(), kOp, ": layer ", l, "'s weight ", j, " is None");
  TORCH_CHECK(k_caches[0].dim() == 4, kOp, ": k_caches must be [B, Hkv, T, D]; got ", k_caches[0].sizes());
  const int64_t D = k_caches[0].size(3);
  TORCH_CHECK(lengths.scalar_type() == at::kLong && lengths.is_contiguous() && lengths.sizes() == at::IntArrayRef{B},
              kOp, ": lengths must be a contiguous int64 [", B, "] tensor; got ", lengths.scalar_type(), " ",
              lengths.sizes());
  if (vocab_ids.has_value())
    TORCH_CHECK(vocab_ids->scalar_type() == at::kLong && vocab_ids->is_contiguous() &&
                    vocab_ids->sizes() == at::IntArrayRef{vocab_size},
                kOp, ": vocab_ids must be a contiguous int64 [", vocab_size, "] tensor; got ",
                vocab_ids->scalar_type(), " ", vocab_ids->sizes());

  // The anchors' embeddings, row 0 of each block; the rows' RoPE at positions lengths[b] + i.
  const int64_t* ids = anchors.data_ptr<int64_t>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  float* x = block.data_ptr<float>();
  const int64_t V = embed.size(0);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(ids[b] >= 0 && ids[b] < V, kOp, ": anchors[", b, "] = ", ids[b], " is outside the vocabulary [0, ",
                V, ")");
    std::memcpy(x + b * n * H, embed.data_ptr<float>() + ids[b] * H, sizeof(float) * H);
  }
  const auto [cos, sin] = rope_rows(kOp, rope_cos, rope_sin, len, B, n, D);
  // The block sees itself whole (bidirectional within the block; every context slot before it).
  at::Tensor sees = at::empty({B, n, n}, block.options().dtype(at::kBool));
  std::fill_n(sees.data_ptr<bool>(), B * n * n, true);

  // The layers, their states ping-ponging between two buffers (the op reads x while it writes out).
  at::Tensor states[2] = {at::empty({B, n, H}, block.options()), at::empty({B, n, H}, block.options())};
  at::Tensor x_in = block;
  for (int64_t l = 0; l < L; ++l) {
    auto w = [&](int64_t j) { return layers.get(l * kLayerArgs + j); };
    at::Tensor k_cache = k_caches[l], v_cache = v_caches[l];
    at::Tensor& out = states[l % 2];
    TORCH_CHECK(k_cache.dim() == 4, kOp, ": k_caches[", l, "] must be [B, Hkv, T, D]; got ", k_cache.sizes());
    decoder_layer_cpu(x_in, *w(0), *w(1), norm_eps, *w(2), w(3), *w(4), w(5), *w(6), w(7), *w(8), w(9), w(10), w(11),
                      cos, sin, k_cache, v_cache, lengths, sees, num_heads, k_cache.size(1), sm_scale, out, 0);
    x_in = out;
  }

  // The drafted positions 1 .. depth of each block, (b, i) -> row b * depth + i - 1, through the head.
  const int64_t M = B * depth;
  at::Tensor rows = at::empty({M, H}, block.options());
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(rows.data_ptr<float>() + b * depth * H, x_in.data_ptr<float>() + (b * n + 1) * H,
                sizeof(float) * depth * H);
  at::Tensor values = at::empty({M, k}, block.options());
  at::Tensor indices = at::empty({M, k}, anchors.options());
  at::Tensor status = at::empty({M}, block.options().dtype(at::kInt));
  std::optional<at::Tensor> lse;
  if (log_probs) lse = at::empty({M}, block.options());
  mtp_head_topk_packed_cpu(rows, final_norm, head, vocab_size, norm_eps, values, indices, std::nullopt, status, lse);
  if (log_probs) {
    float* v = values.data_ptr<float>();
    const float* s = lse->data_ptr<float>();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t j = 0; j < k; ++j) v[m * k + j] -= s[m];
  }
  if (vocab_ids.has_value()) {
    int64_t* index = indices.data_ptr<int64_t>();
    const int64_t* token = vocab_ids->data_ptr<int64_t>();
    for (int64_t e = 0; e < M * k; ++e)  // a flagged row's entries may be anything: left as they are
      if (index[e] >= 0 && index[e] < vocab_size) index[e] = token[index[e]];
  }
  return {values.view({B, depth, k}), indices.view({B, depth, k}), status};
}

void dflash_extend_cpu(at::TensorList hidden, const at::Tensor& fc_w, const at::Tensor& context_norm,
                       const at::Tensor& kv_w, const std::optional<at::Tensor>& kv_b, const at::Tensor& k_norm,
                       double norm_eps, const at::Tensor& rope_cos, const at::Tensor& rope_sin, at::Tensor& k_cache,
                       at::Tensor& v_cache, at::Tensor& lengths, const at::Tensor& num_new) {
  // hidden: per target layer read (B, n, H_l) float32, in the drafter's order (concatenated along
  // features: fc_w's input); the rest as context_kv's, with the RoPE rows lengths[b] + i of the
  // (P, D) tables; num_new (B,) int64 in [0, n]: lengths[b] += num_new[b] afterwards.
  constexpr const char* op = "dflash_extend";
  TORCH_CHECK(!hidden.empty() && hidden[0].dim() == 3, op, ": hidden must list [B, n, features] tensors");
  const int64_t B = hidden[0].size(0), n = hidden[0].size(1);
  int64_t F = 0;
  for (size_t i = 0; i < hidden.size(); ++i) {
    const at::Tensor& h = hidden[i];
    TORCH_CHECK(h.scalar_type() == at::kFloat && h.is_contiguous() && h.dim() == 3 && h.size(0) == B &&
                    h.size(1) == n,
                op, ": hidden[", i, "] must be a contiguous float32 [", B, ", ", n, ", features] tensor; got ",
                h.scalar_type(), " ", h.sizes());
    F += h.size(2);
  }
  TORCH_CHECK(k_cache.dim() == 5, op, ": k_cache must be [layers, B, Hkv, T, D]; got ", k_cache.sizes());
  const int64_t D = k_cache.size(4);
  for (const at::Tensor* t : {static_cast<const at::Tensor*>(&lengths), &num_new})
    TORCH_CHECK(t->scalar_type() == at::kLong && t->is_contiguous() && t->sizes() == at::IntArrayRef{B}, op,
                ": lengths and num_new must be contiguous int64 [", B, "] tensors; got ", t->scalar_type(), " ",
                t->sizes());
  int64_t* len = lengths.data_ptr<int64_t>();
  const int64_t* add = num_new.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(add[b] >= 0 && add[b] <= n, op, ": num_new[", b, "] = ", add[b], " is outside [0, ", n, "]");
  const auto [cos, sin] = rope_rows(op, rope_cos, rope_sin, len, B, n, D);
  // The features concatenated per token, (B, n, F).
  at::Tensor feats = at::empty({B, n, F}, hidden[0].options());
  float* dst = feats.data_ptr<float>();
  for (int64_t m = 0, offset = 0; m < B * n; ++m, offset = 0)
    for (const at::Tensor& h : hidden) {
      const int64_t width = h.size(2);
      std::memcpy(dst + m * F + offset, h.data_ptr<float>() + m * width, sizeof(float) * width);
      offset += width;
    }
  context_kv_cpu(feats, fc_w, context_norm, kv_w, kv_b, k_norm, norm_eps, cos, sin, k_cache, v_cache, lengths);
  for (int64_t b = 0; b < B; ++b) len[b] += add[b];
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("dflash_block_topk", &dflash_block_topk_cpu);
  m.impl("dflash_extend", &dflash_extend_cpu);
}
// Not differentiable (ranks and ids): its outputs never require grad, whatever its inputs do.
TORCH_LIBRARY_IMPL(specdec, Autograd, m) { m.impl("dflash_block_topk", torch::CppFunction::makeFallthrough()); }

}  // namespace specdec::ops
