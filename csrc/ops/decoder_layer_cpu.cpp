// CPU glue of the `decoder_layer` family: one Llama/Qwen decoder layer for the few token rows of a
// decoding or verification forward, as one op (kernels: csrc/kernels/decoder_layer for the norms,
// RoPE, attention and SwiGLU; csrc/kernels/skinny_linear/packed_cpu for the four projections).
// Reference: specdec_cuda/reference/decoder_layer.py (the model's own torch layer). CPU only: a
// CUDA model runs its layers as torch ops.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "kernels/decoder_layer/decoder_layer_cpu.h"
#include "kernels/skinny_linear/packed_cpu.h"
#include "ops/claim_parallel.h"
#include "ops/packed_linear.h"

namespace specdec::ops {
namespace {

constexpr const char* kOp = "decoder_layer";

// A float32 tensor, contiguous, of exactly `shape`.
void check_f32(const at::Tensor& t, const char* name, at::IntArrayRef shape) {
  TORCH_CHECK(t.scalar_type() == at::kFloat && t.is_contiguous() && t.sizes() == shape, kOp, ": ", name,
              " must be a contiguous float32 tensor of shape ", shape, "; got ", t.scalar_type(), " ", t.sizes());
}

// A packed weight (skinny_linear_packed's layout) for an [N, K] projection, and its bias.
void check_packed(const at::Tensor& packed, const std::optional<at::Tensor>& bias, const char* name, int64_t N,
                  int64_t K) {
  const int64_t panels = (N + skinny::kPanel - 1) / skinny::kPanel;
  TORCH_CHECK((packed.scalar_type() == at::kFloat || packed.scalar_type() == at::kBFloat16) &&
                  packed.is_contiguous() && packed.dim() == 3 && packed.size(0) == panels && packed.size(1) == K &&
                  packed.size(2) == skinny::kPanel,
              kOp, ": ", name, " must be a packed float32 / bfloat16 weight [", panels, ", ", K, ", ", skinny::kPanel,
              "] (N=", N, "); got ", packed.scalar_type(), " ", packed.sizes());
  if (bias.has_value()) check_f32(*bias, "a bias", {N});
}

// y [M, N] = x [M, K] · Wᵀ + bias.
void linear(const float* x, int64_t M, int64_t K, const at::Tensor& packed, const std::optional<at::Tensor>& bias,
            float* y, int64_t N) {
  packed_linear(x, M, K, packed, bias.has_value() ? bias->data_ptr<float>() : nullptr, y, N);
}

void decoder_layer_cpu(const at::Tensor& x, const at::Tensor& norm1, const at::Tensor& norm2, double norm_eps,
                       const at::Tensor& qkv_w, const std::optional<at::Tensor>& qkv_b, const at::Tensor& o_w,
                       const std::optional<at::Tensor>& o_b, const at::Tensor& gate_up_w,
                       const std::optional<at::Tensor>& gate_up_b, const at::Tensor& down_w,
                       const std::optional<at::Tensor>& down_b, const std::optional<at::Tensor>& q_norm,
                       const std::optional<at::Tensor>& k_norm, const at::Tensor& cos, const at::Tensor& sin,
                       at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& lengths,
                       const std::optional<at::Tensor>& tree_mask, int64_t num_heads, int64_t num_kv_heads,
                       double sm_scale, at::Tensor& out) {
  // x, out: (B, n, Hd) float32; k_cache, v_cache: (B, Hkv, T, D) float32; cos, sin: (B, n, D);
  // lengths: (B,) int64; tree_mask: (B, n, n) bool or None; weights packed (see check_packed).
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.is_contiguous(), kOp,
              ": x must be a contiguous float32 [B, n, hidden] tensor; got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(k_cache.dim() == 4, kOp, ": k_cache must be [B, Hkv, T, D]; got ", k_cache.sizes());
  const int64_t B = x.size(0), n = x.size(1), Hd = x.size(2), M = B * n;
  const int64_t Hkv = k_cache.size(1), T = k_cache.size(2), D = k_cache.size(3), Hq = num_heads;
  TORCH_CHECK(num_kv_heads == Hkv && Hq > 0 && Hq % Hkv == 0 && D % 2 == 0, kOp, ": ", Hq, " query heads over ",
              num_kv_heads, " KV heads (cache: ", Hkv, " heads of dim ", D, ") do not fit");
  check_f32(k_cache, "k_cache", {B, Hkv, T, D});
  check_f32(v_cache, "v_cache", {B, Hkv, T, D});
  check_f32(norm1, "norm1", {Hd});
  check_f32(norm2, "norm2", {Hd});
  check_f32(cos, "cos", {B, n, D});
  check_f32(sin, "sin", {B, n, D});
  check_f32(out, "out", {B, n, Hd});
  if (q_norm.has_value() || k_norm.has_value()) {
    TORCH_CHECK(q_norm.has_value() && k_norm.has_value(), kOp, ": q_norm and k_norm go together");
    check_f32(*q_norm, "q_norm", {D});
    check_f32(*k_norm, "k_norm", {D});
  }
  const int64_t QKV = (Hq + 2 * Hkv) * D, I = down_w.dim() == 3 ? down_w.size(1) : 0;
  check_packed(qkv_w, qkv_b, "qkv", QKV, Hd);
  check_packed(o_w, o_b, "o", Hd, Hq * D);
  check_packed(gate_up_w, gate_up_b, "gate_up", 2 * I, Hd);
  check_packed(down_w, down_b, "down", Hd, I);
  TORCH_CHECK(lengths.scalar_type() == at::kLong && lengths.is_contiguous() && lengths.sizes() == at::IntArrayRef{B},
              kOp, ": lengths must be a contiguous int64 [", B, "] tensor; got ", lengths.scalar_type(), " ",
              lengths.sizes());
  const int64_t* len = lengths.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    TORCH_CHECK(len[b] >= 0 && len[b] + n <= T, kOp, ": row ", b, " holds ", len[b], " tokens; ", n,
                " more do not fit its ", T, " cache slots");
  const bool* mask = nullptr;
  if (tree_mask.has_value()) {
    TORCH_CHECK(tree_mask->scalar_type() == at::kBool && tree_mask->is_contiguous() &&
                    tree_mask->sizes() == at::IntArrayRef({B, n, n}),
                kOp, ": tree_mask must be a contiguous bool [", B, ", ", n, ", ", n, "] tensor; got ",
                tree_mask->scalar_type(), " ", tree_mask->sizes());
    mask = tree_mask->data_ptr<bool>();
  }
  if (M == 0) return;

  // Scratch: h [M, Hd], qkv [M, QKV], attn [M, Hq D], gate_up [M, 2I], act [M, I].
  std::vector<float> scratch(M * (Hd + QKV + Hq * D + 3 * I));
  float* h = scratch.data();
  float* qkv = h + M * Hd;
  float* attn = qkv + M * QKV;
  float* gate_up = attn + M * Hq * D;
  float* act = gate_up + M * 2 * I;
  const float* xin = x.data_ptr<float>();
  float* y = out.data_ptr<float>();
  const float eps = static_cast<float>(norm_eps);
  const layer::AttentionShape shape{B, n, Hq, Hkv, D, T};

  layer::rms_norm_rows(xin, norm1.data_ptr<float>(), eps, M, Hd, h);
  linear(h, M, Hd, qkv_w, qkv_b, qkv, QKV);
  layer::rope_and_store(qkv, cos.data_ptr<float>(), sin.data_ptr<float>(),
                        q_norm.has_value() ? q_norm->data_ptr<float>() : nullptr,
                        k_norm.has_value() ? k_norm->data_ptr<float>() : nullptr, eps, k_cache.data_ptr<float>(),
                        v_cache.data_ptr<float>(), len, shape);
  // (row, query head) items, claimed one at a time (ops/claim_parallel.h: no wait for a helper the
  // OS has not scheduled); each item's outputs are computed whole by one thread.
  claim_parallel_range(0, B * Hq, 1, [&](int64_t begin, int64_t end) {
    layer::attend(qkv, k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), len, mask,
                  static_cast<float>(sm_scale), shape, attn, begin, end);
  });
  linear(attn, M, Hq * D, o_w, o_b, y, Hd);
  for (int64_t e = 0; e < M * Hd; ++e) y[e] += xin[e];
  layer::rms_norm_rows(y, norm2.data_ptr<float>(), eps, M, Hd, h);
  linear(h, M, Hd, gate_up_w, gate_up_b, gate_up, 2 * I);
  layer::silu_mul_rows(gate_up, M, I, act);
  linear(act, M, I, down_w, down_b, h, Hd);
  for (int64_t e = 0; e < M * Hd; ++e) y[e] += h[e];
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) { m.impl("decoder_layer", &decoder_layer_cpu); }

}  // namespace specdec::ops
