// CPU glue of the `decoder_layer` family: one Llama/Qwen decoder layer for the few token rows of a
// decoding or verification forward, as one op (kernels: csrc/kernels/decoder_layer for the norms,
// RoPE, attention and SwiGLU; csrc/kernels/skinny_linear/packed_cpu for the four projections).
// Reference: specdec_cuda/reference/decoder_layer.py (the model's own torch layer). CPU only: a
// CUDA model runs its layers as torch ops.
#include "ops/aten.h"
#include <torch/library.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "kernels/decoder_layer/decoder_layer_cpu.h"
#include "kernels/skinny_linear/packed_cpu.h"
#include "ops/claim_parallel.h"
#include "ops/decoder_layer_cpu.h"
#include "ops/gguf_linear.h"
#include "ops/packed_linear.h"

namespace specdec::ops {
namespace {

constexpr const char* kOp = "decoder_layer";

// A float32 tensor, contiguous, of exactly `shape`.
void check_f32(const char* op, const at::Tensor& t, const char* name, at::IntArrayRef shape) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.sizes() == shape, op, ": ", name,
              " must be a contiguous float32 tensor of shape ", shape, "; got ", t.scalar_type(), " ", t.sizes());
}

// A packed weight (skinny_linear_packed's layout) for an [N, K] projection, and its bias.
void check_packed(const at::Tensor& packed, const std::optional<at::Tensor>& bias, const char* name, int64_t N,
                  int64_t K, const char* op = kOp) {
  const int64_t panels = (N + skinny::kPanel - 1) / skinny::kPanel;
  TORCH_CHECK((packed.scalar_type() == at::kFloat || packed.scalar_type() == at::kBFloat16) &&
                  packed.is_contiguous() && packed.dim() == 3 && packed.size(0) == panels && packed.size(1) == K &&
                  packed.size(2) == skinny::kPanel,
              op, ": ", name, " must be a packed float32 / bfloat16 weight [", panels, ", ", K, ", ", skinny::kPanel,
              "] (N=", N, "); got ", packed.scalar_type(), " ", packed.sizes());
  if (bias.has_value()) check_f32(op, *bias, "a bias", {N});
}

// lengths (B,) int64, each row's n new tokens within its T cache slots; returns its data.
const int64_t* check_lengths(const char* op, const at::Tensor& lengths, int64_t B, int64_t n, int64_t T) {
  TORCH_CHECK(lengths.scalar_type() == at::kLong && lengths.is_contiguous() && lengths.sizes() == at::IntArrayRef{B},
              op, ": lengths must be a contiguous int64 [", B, "] tensor; got ", lengths.scalar_type(), " ",
              lengths.sizes());
  const int64_t* len = lengths.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(len[b] >= 0 && len[b] + n <= T, op, ": row ", b, " holds ", len[b], " tokens; ", n,
                " more do not fit its ", T, " cache slots");
  return len;
}

// The checked geometry of one call: x (B, n, Hd), caches (B, Hkv, T, D), Hq query heads.
struct LayerShape {
  int64_t B, n, Hd, M, Hq, Hkv, D, T, QKV;
  const int64_t* lengths;
  const bool* tree_mask;  // (B, n, n) or nullptr (causal)
};

// Checks everything but the projection weights (the two ops store those differently).
LayerShape check_layer(const char* op, const at::Tensor& x, const at::Tensor& norm1, const at::Tensor& norm2,
                       const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm,
                       const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& lengths,
                       const std::optional<at::Tensor>& tree_mask, int64_t num_heads, int64_t num_kv_heads,
                       const at::Tensor& out) {
  // x, out: (B, n, Hd) float32; k_cache, v_cache: (B, Hkv, T, D) float32; cos, sin: (B, n, D);
  // lengths: (B,) int64; tree_mask: (B, n, n) bool or None.
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.is_contiguous(), op,
              ": x must be a contiguous float32 [B, n, hidden] tensor; got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(k_cache.dim() == 4, op, ": k_cache must be [B, Hkv, T, D]; got ", k_cache.sizes());
  LayerShape s{};
  s.B = x.size(0), s.n = x.size(1), s.Hd = x.size(2), s.M = s.B * s.n;
  s.Hkv = k_cache.size(1), s.T = k_cache.size(2), s.D = k_cache.size(3), s.Hq = num_heads;
  TORCH_CHECK(num_kv_heads == s.Hkv && s.Hq > 0 && s.Hq % s.Hkv == 0 && s.D % 2 == 0, op, ": ", s.Hq,
              " query heads over ", num_kv_heads, " KV heads (cache: ", s.Hkv, " heads of dim ", s.D, ") do not fit");
  s.QKV = (s.Hq + 2 * s.Hkv) * s.D;
  check_f32(op, k_cache, "k_cache", {s.B, s.Hkv, s.T, s.D});
  check_f32(op, v_cache, "v_cache", {s.B, s.Hkv, s.T, s.D});
  check_f32(op, norm1, "norm1", {s.Hd});
  check_f32(op, norm2, "norm2", {s.Hd});
  check_f32(op, cos, "cos", {s.B, s.n, s.D});
  check_f32(op, sin, "sin", {s.B, s.n, s.D});
  check_f32(op, out, "out", {s.B, s.n, s.Hd});
  if (q_norm.has_value() || k_norm.has_value()) {
    TORCH_CHECK(q_norm.has_value() && k_norm.has_value(), op, ": q_norm and k_norm go together");
    check_f32(op, *q_norm, "q_norm", {s.D});
    check_f32(op, *k_norm, "k_norm", {s.D});
  }
  s.lengths = check_lengths(op, lengths, s.B, s.n, s.T);
  s.tree_mask = nullptr;
  if (tree_mask.has_value()) {
    TORCH_CHECK(tree_mask->scalar_type() == at::kBool && tree_mask->is_contiguous() &&
                    tree_mask->sizes() == at::IntArrayRef({s.B, s.n, s.n}),
                op, ": tree_mask must be a contiguous bool [", s.B, ", ", s.n, ", ", s.n, "] tensor; got ",
                tree_mask->scalar_type(), " ", tree_mask->sizes());
    s.tree_mask = tree_mask->data_ptr<bool>();
  }
  return s;
}

const float* data_or_null(const std::optional<at::Tensor>& t) { return t.has_value() ? t->data_ptr<float>() : nullptr; }

// The layer itself, over projections given by `linear(p, x, M, K, y, N)`, p = 0 q|k|v, 1 o,
// 2 gate|up, 3 down (y [M, N] = x [M, K] · W_pᵀ + b_p); I is the MLP's intermediate size.
template <class Linear>
void run_layer(const LayerShape& s, int64_t I, const at::Tensor& x, const at::Tensor& norm1, const at::Tensor& norm2,
               double norm_eps, const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm,
               const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
               double sm_scale, at::Tensor& out, const Linear& linear) {
  const int64_t M = s.M, Hd = s.Hd, QKV = s.QKV, Hq = s.Hq, D = s.D;
  if (M == 0) return;
  // Scratch: h [M, Hd], qkv [M, QKV], attn [M, Hq D], gate_up [M, 2I], act [M, I]. Kept per thread
  // and grown, never shrunk or cleared (every element is written before it is read): a fresh
  // vector per call cost a 168-row prefill of the 1.5B ~10% in page faults and zeroing (21 MB per
  // layer).
  static thread_local std::vector<float> scratch;
  const size_t need = static_cast<size_t>(M * (Hd + QKV + Hq * D + 3 * I));
  if (scratch.size() < need) scratch.resize(need);
  float* h = scratch.data();
  float* qkv = h + M * Hd;
  float* attn = qkv + M * QKV;
  float* gate_up = attn + M * Hq * D;
  float* act = gate_up + M * 2 * I;
  const float* xin = x.data_ptr<float>();
  float* y = out.data_ptr<float>();
  const float eps = static_cast<float>(norm_eps);
  const layer::AttentionShape shape{s.B, s.n, Hq, s.Hkv, D, s.T};

  layer::rms_norm_rows(xin, norm1.data_ptr<float>(), eps, M, Hd, h);
  linear(0, h, M, Hd, qkv, QKV);
  layer::rope_and_store(qkv, cos.data_ptr<float>(), sin.data_ptr<float>(), data_or_null(q_norm), data_or_null(k_norm),
                        eps, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), s.lengths, shape);
  // (row, query head) items, claimed one at a time (ops/claim_parallel.h: no wait for a helper the
  // OS has not scheduled); each item's outputs are computed whole by one thread.
  claim_parallel_range(0, s.B * Hq, 1, [&](int64_t begin, int64_t end) {
    layer::attend(qkv, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), s.lengths, s.tree_mask,
                  static_cast<float>(sm_scale), shape, attn, begin, end);
  });
  linear(1, attn, M, Hq * D, y, Hd);
  for (int64_t e = 0; e < M * Hd; ++e) y[e] += xin[e];
  layer::rms_norm_rows(y, norm2.data_ptr<float>(), eps, M, Hd, h);
  linear(2, h, M, Hd, gate_up, 2 * I);
  layer::silu_mul_rows(gate_up, M, I, act);
  linear(3, act, M, I, h, Hd);
  for (int64_t e = 0; e < M * Hd; ++e) y[e] += h[e];
}

}  // namespace

void decoder_layer_cpu(const at::Tensor& x, const at::Tensor& norm1, const at::Tensor& norm2, double norm_eps,
                       const at::Tensor& qkv_w, const std::optional<at::Tensor>& qkv_b, const at::Tensor& o_w,
                       const std::optional<at::Tensor>& o_b, const at::Tensor& gate_up_w,
                       const std::optional<at::Tensor>& gate_up_b, const at::Tensor& down_w,
                       const std::optional<at::Tensor>& down_b, const std::optional<at::Tensor>& q_norm,
                       const std::optional<at::Tensor>& k_norm, const at::Tensor& cos, const at::Tensor& sin,
                       at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& lengths,
                       const std::optional<at::Tensor>& tree_mask, int64_t num_heads, int64_t num_kv_heads,
                       double sm_scale, at::Tensor& out, int64_t activations) {
  // Weights packed (see check_packed), biases float32 or None; the rest as check_layer says.
  // activations: 0 float32 (exact), 1 bfloat16-rounded on the AMX tier (a prompt's prefill; the
  // FMA tiers and float32 panels ignore it: kernels/skinny_linear/packed_cpu.h).
  TORCH_CHECK(activations == 0 || activations == 1, kOp, ": activations must be 0 (float32) or 1 (bfloat16-rounded, "
              "a prefill's); got ", activations);
  const LayerShape s = check_layer(kOp, x, norm1, norm2, q_norm, k_norm, cos, sin, k_cache, v_cache, lengths,
                                   tree_mask, num_heads, num_kv_heads, out);
  const int64_t I = down_w.dim() == 3 ? down_w.size(1) : 0;
  check_packed(qkv_w, qkv_b, "qkv", s.QKV, s.Hd);
  check_packed(o_w, o_b, "o", s.Hd, s.Hq * s.D);
  check_packed(gate_up_w, gate_up_b, "gate_up", 2 * I, s.Hd);
  check_packed(down_w, down_b, "down", s.Hd, I);
  const at::Tensor* weights[4] = {&qkv_w, &o_w, &gate_up_w, &down_w};
  const std::optional<at::Tensor>* biases[4] = {&qkv_b, &o_b, &gate_up_b, &down_b};
  run_layer(s, I, x, norm1, norm2, norm_eps, q_norm, k_norm, cos, sin, k_cache, v_cache, sm_scale, out,
            [&](int p, const float* in, int64_t M, int64_t K, float* y, int64_t N) {
              packed_linear(in, M, K, *weights[p], data_or_null(*biases[p]), y, N, activations == 1);
            });
}

namespace {

void decoder_layer_gguf_cpu(const at::Tensor& x, const at::Tensor& norm1, const at::Tensor& norm2, double norm_eps,
                            at::TensorList weights, at::IntArrayRef types, at::IntArrayRef parts,
                            int64_t activations, const std::optional<at::Tensor>& qkv_b, const std::optional<at::Tensor>& o_b,
                            const std::optional<at::Tensor>& gate_up_b, const std::optional<at::Tensor>& down_b,
                            const std::optional<at::Tensor>& q_norm, const std::optional<at::Tensor>& k_norm,
                            const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache, at::Tensor& v_cache,
                            const at::Tensor& lengths, const std::optional<at::Tensor>& tree_mask, int64_t num_heads,
                            int64_t num_kv_heads, double sm_scale, at::Tensor& out) {
  // weights: the GGUF parts of q|k|v, o, gate|up, down in order (parts[p] of projection p), each
  // uint8 [rows, row bytes] with its type id in types; activations 0 float32, 1 Q8
  // (ops/gguf_linear.h); biases float32 or None.
  constexpr const char* op = "decoder_layer_gguf";
  const GgufActivations mode = gguf_activations(op, activations);
  const LayerShape s = check_layer(op, x, norm1, norm2, q_norm, k_norm, cos, sin, k_cache, v_cache, lengths,
                                   tree_mask, num_heads, num_kv_heads, out);
  TORCH_CHECK(parts.size() == 4 && std::all_of(parts.begin(), parts.end(), [](int64_t c) { return c > 0; }), op,
              ": parts must give the number of GGUF parts of q|k|v, o, gate|up and down (4 positive counts); got ",
              parts);
  int64_t total = 0;
  for (int64_t c : parts) total += c;
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == total && types.size() == weights.size(), op, ": parts add up to ",
              total, " weights; got ", weights.size(), " weights and ", types.size(), " types");
  const int64_t first[4] = {0, parts[0], parts[0] + parts[1], parts[0] + parts[1] + parts[2]};
  auto slice = [&](int p) { return std::make_pair(weights.slice(first[p], parts[p]), types.slice(first[p], parts[p])); };
  // The MLP's width comes from down's in_features: its blocks' bytes per row over the format's.
  const auto [down_w, down_t] = slice(3);
  const int32_t t3 = static_cast<int32_t>(down_t[0]);
  TORCH_CHECK(gguf::block_weights(t3) > 0 && down_w[0].dim() == 2, op, ": down's first part must be a GGUF weight");
  const int64_t I = down_w[0].size(1) / gguf::block_bytes(t3) * gguf::block_weights(t3);
  const char* names[4] = {"qkv", "o", "gate_up", "down"};
  const int64_t shapes[4][2] = {{s.QKV, s.Hd}, {s.Hd, s.Hq * s.D}, {2 * I, s.Hd}, {s.Hd, I}};
  const std::optional<at::Tensor>* biases[4] = {&qkv_b, &o_b, &gate_up_b, &down_b};
  std::vector<GgufPart> linears[4];
  for (int p = 0; p < 4; ++p) {
    const auto [w, t] = slice(p);
    linears[p] = check_gguf_parts(op, names[p], w, t, shapes[p][0], shapes[p][1]);
    if (biases[p]->has_value()) check_f32(op, **biases[p], "a bias", {shapes[p][0]});
  }
  run_layer(s, I, x, norm1, norm2, norm_eps, q_norm, k_norm, cos, sin, k_cache, v_cache, sm_scale, out,
            [&](int p, const float* in, int64_t M, int64_t K, float* y, int64_t N) {
              gguf_linear(in, M, K, linears[p], data_or_null(*biases[p]), y, N, mode);
            });
}

}  // namespace

void context_kv_cpu(const at::Tensor& hidden, const at::Tensor& fc_w, const at::Tensor& context_norm,
                    const at::Tensor& kv_w, const std::optional<at::Tensor>& kv_b, const at::Tensor& k_norm,
                    double norm_eps, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                    at::Tensor& v_cache, const at::Tensor& lengths) {
  // hidden: (B, n, F) float32, the target's hidden states at the layers read, concatenated;
  // fc_w: packed [H, F]; context_norm: (H,); kv_w: packed [L * 2 * Hkv * D, H] (per layer its
  // k_proj then its v_proj), kv_b (L * 2 * Hkv * D,) or None; k_norm: (L, D); cos, sin: (B, n, D);
  // k_cache, v_cache: (L, B, Hkv, T, D) float32; lengths: (B,) int64.
  constexpr const char* op = "context_kv";
  TORCH_CHECK(hidden.dim() == 3 && hidden.scalar_type() == at::kFloat && hidden.is_contiguous(), op,
              ": hidden must be a contiguous float32 [B, n, features] tensor; got ", hidden.scalar_type(), " ",
              hidden.sizes());
  TORCH_CHECK(k_cache.dim() == 5, op, ": k_cache must be [layers, B, Hkv, T, D]; got ", k_cache.sizes());
  const int64_t B = hidden.size(0), n = hidden.size(1), F = hidden.size(2), M = B * n;
  const int64_t L = k_cache.size(0), Hkv = k_cache.size(2), T = k_cache.size(3), D = k_cache.size(4);
  TORCH_CHECK(context_norm.dim() == 1, op, ": context_norm must be [hidden]; got ", context_norm.sizes());
  const int64_t H = context_norm.size(0), W = 2 * Hkv * D;
  TORCH_CHECK(k_cache.size(1) == B && D % 2 == 0, op, ": k_cache ", k_cache.sizes(), " does not fit ", B,
              " rows (and D must be even)");
  check_f32(op, k_cache, "k_cache", {L, B, Hkv, T, D});
  check_f32(op, v_cache, "v_cache", {L, B, Hkv, T, D});
  check_f32(op, context_norm, "context_norm", {H});
  check_f32(op, k_norm, "k_norm", {L, D});
  check_f32(op, cos, "cos", {B, n, D});
  check_f32(op, sin, "sin", {B, n, D});
  check_packed(fc_w, std::nullopt, "fc_w", H, F, op);
  check_packed(kv_w, kv_b, "kv_w", L * W, H, op);
  const int64_t* len = check_lengths(op, lengths, B, n, T);
  if (M == 0) return;
  // Scratch: fc [M, H], feats [M, H], kv [M, L W], one layer's k|v [M, W]; per thread, grown only.
  static thread_local std::vector<float> scratch;
  const size_t need = static_cast<size_t>(M * (2 * H + L * W + W));
  if (scratch.size() < need) scratch.resize(need);
  float* fc = scratch.data();
  float* feats = fc + M * H;
  float* kv = feats + M * H;
  float* one = kv + M * L * W;
  const float eps = static_cast<float>(norm_eps);
  packed_linear(hidden.data_ptr<float>(), M, F, fc_w, nullptr, fc, H);
  layer::rms_norm_rows(fc, context_norm.data_ptr<float>(), eps, M, H, feats);
  packed_linear(feats, M, H, kv_w, data_or_null(kv_b), kv, L * W);
  // Per layer its k|v heads as a decoder layer's q|k|v rows with no query heads: k RMS-normalised
  // by the layer's k_norm and rotated, then k and v copied to slots lengths[b] + i.
  const layer::AttentionShape shape{B, n, 0, Hkv, D, T};
  const int64_t cache_layer = B * Hkv * T * D;
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t m = 0; m < M; ++m) std::copy_n(kv + m * L * W + l * W, W, one + m * W);
    layer::rope_and_store(one, cos.data_ptr<float>(), sin.data_ptr<float>(), nullptr, k_norm.data_ptr<float>() + l * D,
                          eps, k_cache.data_ptr<float>() + l * cache_layer, v_cache.data_ptr<float>() + l * cache_layer,
                          len, shape);
  }
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("decoder_layer", &decoder_layer_cpu);
  m.impl("decoder_layer_gguf", &decoder_layer_gguf_cpu);
  m.impl("context_kv", &context_kv_cpu);
}

}  // namespace specdec::ops
