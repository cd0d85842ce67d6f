// CPU glue of the `mtp` family: fused MTP-head output side (norm + LM head + top-k) and input side
// (embedding gather + two norms + split eh_proj). Kernels: csrc/kernels/mtp/mtp_cpu.h.
#include "ops/aten.h"
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "kernels/common/dtype.h"
#include "kernels/common/status.h"
#include "kernels/mtp/mtp_cpu.h"
#include "ops/mtp_common.h"
#include "ops/mtp_cpu.h"
#include "ops/quant_common.h"
#include "ops/quant_parallel.h"
#include "kernels/quant/w4_cpu.h"
#include "kernels/skinny_linear/packed_cpu.h"

namespace specdec::ops {
namespace {

// Vocabulary rows per range, a multiple of the 4-bit weight's 16-row tile and of the packed head's
// 64-row panel: 256 rows x H = 4096 x 4 B = 4 MiB of lm_head, tens of microseconds; small
// vocabularies run as one range.
constexpr int64_t kVocabRange = 256;

template <typename T, typename Acc>
void head_topk_typed(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& lm_head, double eps,
                     at::Tensor& values, at::Tensor& indices, Acc* logits, at::Tensor& status, int64_t k) {
  const int64_t M = x.size(0), H = x.size(1), V = lm_head.size(0);
  const auto acc_opts = values.options();
  at::Tensor xn = at::empty({M, H}, acc_opts);
  mtp::rms_normalize_rows<T, Acc>(reinterpret_cast<const T*>(x.data_ptr()),
                                  reinterpret_cast<const T*>(norm_weight.data_ptr()), eps, M, H,
                                  xn.data_ptr<Acc>());
  const int64_t parts = std::max<int64_t>(1, (V + kVocabRange - 1) / kVocabRange);
  // Per range: its own top-k per activation row (merged below) and non-finite flags.
  at::Tensor part_vals = at::empty({parts, M, k}, acc_opts);
  at::Tensor part_idx = at::empty({parts, M, k}, indices.options());
  at::Tensor part_n = at::zeros({parts, M}, status.options());
  at::Tensor part_bad = at::zeros({parts, M}, at::TensorOptions().dtype(at::kByte));
  const T* w = reinterpret_cast<const T*>(lm_head.data_ptr());
  parallel_range(0, parts, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      mtp::head_topk_range<T, Acc>(xn.data_ptr<Acc>(), M, H, w, V, p * kVocabRange,
                                   std::min(V, (p + 1) * kVocabRange), static_cast<int>(k),
                                   part_vals.data_ptr<Acc>() + p * M * k, part_idx.data_ptr<int64_t>() + p * M * k,
                                   part_n.data_ptr<int>() + p * M, part_bad.data_ptr<uint8_t>() + p * M, logits);
    }
  });
  mtp::merge_topk<Acc>(part_vals.data_ptr<Acc>(), part_idx.data_ptr<int64_t>(), part_n.data_ptr<int>(), parts, M,
                       static_cast<int>(k), values.data_ptr<Acc>(), indices.data_ptr<int64_t>());
  const uint8_t* bad = part_bad.data_ptr<uint8_t>();
  int* st = status.data_ptr<int>();
  for (int64_t m = 0; m < M; ++m) {
    st[m] = kStatusOk;
    for (int64_t p = 0; p < parts; ++p)
      if (bad[p * M + m]) st[m] = kStatusNonFiniteLogits;
  }
}

void mtp_head_topk_cpu(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& lm_head, double eps,
                       at::Tensor& values, at::Tensor& indices, std::optional<at::Tensor> logits,
                       at::Tensor& status) {
  const int64_t k = check_head_topk(x, norm_weight, lm_head, values, indices, logits, status);
  if (x.size(0) == 0) return;
  switch (x.scalar_type()) {
    case at::kFloat:
      return head_topk_typed<float, float>(x, norm_weight, lm_head, eps, values, indices,
                                           logits ? logits->data_ptr<float>() : nullptr, status, k);
    case at::kDouble:
      return head_topk_typed<double, double>(x, norm_weight, lm_head, eps, values, indices,
                                             logits ? logits->data_ptr<double>() : nullptr, status, k);
    case at::kBFloat16:
      return head_topk_typed<BFloat16, float>(x, norm_weight, lm_head, eps, values, indices,
                                              logits ? logits->data_ptr<float>() : nullptr, status, k);
    default:
      return head_topk_typed<Half16, float>(x, norm_weight, lm_head, eps, values, indices,
                                            logits ? logits->data_ptr<float>() : nullptr, status, k);
  }
}

template <typename T, typename Acc>
void mtp_input_typed(const at::Tensor& h, const at::Tensor& tokens, const at::Tensor& embed,
                     const at::Tensor& enorm_weight, const at::Tensor& hnorm_weight, const at::Tensor& eh_proj,
                     double eps, at::Tensor& out, at::Tensor& status) {
  const int64_t M = h.size(0), H = h.size(1), V = embed.size(0);
  at::Tensor en = at::empty({M, H}, out.options()), hn = at::empty({M, H}, out.options());
  const int64_t bad = mtp::gather_normalize_rows<T, Acc>(tokens.data_ptr<int64_t>(),
                                                         reinterpret_cast<const T*>(embed.data_ptr()), V,
                                                         reinterpret_cast<const T*>(enorm_weight.data_ptr()), eps, M,
                                                         H, en.data_ptr<Acc>());
  TORCH_CHECK(bad < 0, "tokens[", bad, "] = ", bad < 0 ? 0 : tokens.data_ptr<int64_t>()[bad],
              " is outside the vocabulary [0, ", V, ")");
  mtp::rms_normalize_rows<T, Acc>(reinterpret_cast<const T*>(h.data_ptr()),
                                  reinterpret_cast<const T*>(hnorm_weight.data_ptr()), eps, M, H, hn.data_ptr<Acc>());
  const T* w = reinterpret_cast<const T*>(eh_proj.data_ptr());
  // 32 output rows x 2H: a range of a few microseconds at H = 4096 per activation row.
  parallel_range(0, H, 32, [&](int64_t b, int64_t e) {
    mtp::eh_proj_range<T, Acc>(en.data_ptr<Acc>(), hn.data_ptr<Acc>(), M, H, w, b, e, out.data_ptr<Acc>());
  });
  status.zero_();
}

void mtp_input_cpu(const at::Tensor& h, const at::Tensor& tokens, const at::Tensor& embed,
                   const at::Tensor& enorm_weight, const at::Tensor& hnorm_weight, const at::Tensor& eh_proj,
                   double eps, at::Tensor& out, at::Tensor& status) {
  check_mtp_input(h, tokens, embed, enorm_weight, hnorm_weight, eh_proj, out, status);
  if (h.size(0) == 0) return;
  switch (h.scalar_type()) {
    case at::kFloat:
      return mtp_input_typed<float, float>(h, tokens, embed, enorm_weight, hnorm_weight, eh_proj, eps, out, status);
    case at::kDouble:
      return mtp_input_typed<double, double>(h, tokens, embed, enorm_weight, hnorm_weight, eh_proj, eps, out,
                                             status);
    case at::kBFloat16:
      return mtp_input_typed<BFloat16, float>(h, tokens, embed, enorm_weight, hnorm_weight, eh_proj, eps, out,
                                              status);
    default:
      return mtp_input_typed<Half16, float>(h, tokens, embed, enorm_weight, hnorm_weight, eh_proj, eps, out, status);
  }
}

template <typename T>
void normalize_to_float(const at::Tensor& x, const at::Tensor& w, double eps, at::Tensor& xn) {
  mtp::rms_normalize_rows<T, float>(reinterpret_cast<const T*>(x.data_ptr()), reinterpret_cast<const T*>(w.data_ptr()),
                                    eps, x.size(0), x.size(1), xn.data_ptr<float>());
}

// Scan the vocabulary in ranges of kVocabRange rows split over threads, each range's logits
// [M, range] written by `range_logits(v_begin, v_end, scratch)` into a scratch that stays in cache
// while it is ranked (never [M, V]); merge the threads' top-k lists and set the status per row.
// A thread ranks its consecutive ranges into one list (that of its first range; the others stay
// empty): a list started afresh per range takes ~k (1 + ln(range / k)) insertions each time, which
// at k = 16 over a 1,024-id draft vocabulary was a third of the op.
// `lse` [M] float32, when given: each row's log-sum-exp over the vocabulary, from every range's
// max and sum of exponentials taken while its block is in cache (a draft tree's log-probabilities
// are then its top-k values minus it, with no [M, V] log-softmax).
template <typename RangeLogits>
void rank_vocab_ranges(int64_t M, int64_t V, int64_t k, at::Tensor& values, at::Tensor& indices,
                       std::optional<at::Tensor>& logits, at::Tensor& status, const RangeLogits& range_logits,
                       const std::optional<at::Tensor>& lse = std::nullopt) {
  const int64_t parts = (V + kVocabRange - 1) / kVocabRange;
  at::Tensor part_vals = at::empty({parts, M, k}, values.options());
  at::Tensor part_idx = at::empty({parts, M, k}, indices.options());
  at::Tensor part_n = at::zeros({parts, M}, status.options());
  at::Tensor part_bad = at::zeros({parts, M}, at::TensorOptions().dtype(at::kByte));
  at::Tensor scratch = at::empty({parts, M, kVocabRange}, values.options());
  float* out_logits = logits ? logits->data_ptr<float>() : nullptr;
  // per range and row: the largest logit and the sum of exponentials below it (lse only)
  at::Tensor part_mx, part_se;
  if (lse) {
    part_mx = at::empty({parts, M}, values.options());
    part_se = at::empty({parts, M}, values.options());
  }
  parallel_range(0, parts, 1, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const int64_t v0 = p * kVocabRange, v1 = std::min(V, v0 + kVocabRange);
      float* block = scratch.data_ptr<float>() + p * M * kVocabRange;  // [M, v1 - v0]
      range_logits(v0, v1, block);
      mtp::rank_logits_block(block, M, v1 - v0, v0, V, static_cast<int>(k), part_vals.data_ptr<float>() + b * M * k,
                             part_idx.data_ptr<int64_t>() + b * M * k, part_n.data_ptr<int>() + b * M,
                             part_bad.data_ptr<uint8_t>() + p * M, out_logits);
      if (lse)
        mtp::block_max_sumexp(block, M, v1 - v0, part_mx.data_ptr<float>() + p * M, part_se.data_ptr<float>() + p * M);
    }
  });
  mtp::merge_topk<float>(part_vals.data_ptr<float>(), part_idx.data_ptr<int64_t>(), part_n.data_ptr<int>(), parts, M,
                         static_cast<int>(k), values.data_ptr<float>(), indices.data_ptr<int64_t>());
  if (lse) mtp::merge_lse(part_mx.data_ptr<float>(), part_se.data_ptr<float>(), parts, M, lse->data_ptr<float>());
  const uint8_t* bad = part_bad.data_ptr<uint8_t>();
  int* st = status.data_ptr<int>();
  for (int64_t m = 0; m < M; ++m) {
    st[m] = kStatusOk;
    for (int64_t p = 0; p < parts; ++p)
      if (bad[p * M + m]) st[m] = kStatusNonFiniteLogits;
  }
}

void mtp_head_topk_w4_cpu(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& packed,
                          const at::Tensor& scales, int64_t group_size, int64_t vocab_size, double eps,
                          at::Tensor& values, at::Tensor& indices, std::optional<at::Tensor> logits,
                          at::Tensor& status) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
              "x must be float32, float16 or bfloat16 for a 4-bit LM head; got ", dtype);
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [M, H] tensor; got ", x.sizes());
  const int64_t M = x.size(0), H = x.size(1), V = vocab_size;
  check_mtp_float(norm_weight, "norm_weight", dtype);
  TORCH_CHECK(norm_weight.dim() == 1 && norm_weight.size(0) == H, "norm_weight must be [", H, "]; got ",
              norm_weight.sizes());
  const int64_t group = check_w4_shape(V, H, group_size);
  const int64_t tiles = (V + quant::kCpuTileN - 1) / quant::kCpuTileN;
  // packed: (ceil(V/16), H/2, 16) uint8; scales: (ceil(V/16), H/group, 16) float32 (LAYOUT_CPU)
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.size(0) == tiles &&
                  packed.size(1) == H / 2 && packed.size(2) == quant::kCpuTileN && packed.is_contiguous(),
              "packed must be a contiguous uint8 LAYOUT_CPU tensor [", tiles, ", ", H / 2, ", 16] for an LM head [",
              V, ", ", H, "]; got ", packed.scalar_type(), " ", packed.sizes());
  TORCH_CHECK(scales.scalar_type() == at::kFloat && scales.dim() == 3 && scales.size(0) == tiles &&
                  scales.size(1) == H / group && scales.size(2) == quant::kCpuTileN && scales.is_contiguous(),
              "scales must be a contiguous float32 tensor [", tiles, ", ", H / group, ", 16]; got ",
              scales.scalar_type(), " ", scales.sizes());
  const int64_t k = check_topk_outputs(M, V, at::kFloat, values, indices, logits, status);
  if (M == 0) return;
  at::Tensor xn = at::empty({M, H}, values.options());
  if (dtype == at::kFloat) normalize_to_float<float>(x, norm_weight, eps, xn);
  else if (dtype == at::kBFloat16) normalize_to_float<BFloat16>(x, norm_weight, eps, xn);
  else normalize_to_float<Half16>(x, norm_weight, eps, xn);
  rank_vocab_ranges(M, V, k, values, indices, logits, status, [&](int64_t v0, int64_t v1, float* block) {
    mtp::head_logits_w4_range(xn.data_ptr<float>(), M, H, packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), group,
                              v0, v1, block);
  });
}

}  // namespace

void mtp_head_topk_packed_cpu(const at::Tensor& x, const at::Tensor& norm_weight, const at::Tensor& panels,
                              int64_t vocab_size, double eps, at::Tensor& values, at::Tensor& indices,
                              std::optional<at::Tensor> logits, at::Tensor& status, std::optional<at::Tensor> lse) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "x must be a contiguous float32 [M, H] tensor for a packed LM head; got ", x.scalar_type(), " ",
              x.sizes());
  const int64_t M = x.size(0), H = x.size(1), V = vocab_size;
  TORCH_CHECK(V >= 1, "vocab_size must be >= 1; got ", V);
  check_mtp_float(norm_weight, "norm_weight", at::kFloat);
  TORCH_CHECK(norm_weight.dim() == 1 && norm_weight.size(0) == H, "norm_weight must be [", H, "]; got ",
              norm_weight.sizes());
  const int64_t count = (V + skinny::kPanel - 1) / skinny::kPanel;
  TORCH_CHECK((panels.scalar_type() == at::kFloat || panels.scalar_type() == at::kBFloat16) && panels.dim() == 3 &&
                  panels.size(0) == count && panels.size(1) == H && panels.size(2) == skinny::kPanel &&
                  panels.is_contiguous(),
              "panels must be a contiguous float32 or bfloat16 packed LM head [", count, ", ", H, ", ", skinny::kPanel,
              "] (ops.pack_weight of a [", V, ", ", H, "] weight); got ", panels.scalar_type(), " ", panels.sizes());
  const int64_t k = check_topk_outputs(M, V, at::kFloat, values, indices, logits, status);
  if (lse)
    TORCH_CHECK(lse->dim() == 1 && lse->size(0) == M && lse->scalar_type() == at::kFloat && lse->is_contiguous(),
                "lse must be a contiguous [", M, "] float32 tensor; got ", lse->scalar_type(), " ", lse->sizes());
  if (M == 0) return;
  at::Tensor xn = at::empty({M, H}, values.options());
  normalize_to_float<float>(x, norm_weight, eps, xn);
  // bfloat16 panels: xn prepared once for every vocabulary range (see head_logits_packed_range)
  std::vector<uint16_t> split;
  std::optional<skinny::PreparedRowsBf16> bf16_rows;
  if (panels.scalar_type() == at::kBFloat16) bf16_rows = skinny::prepare_rows_bf16(xn.data_ptr<float>(), M, H, split);
  rank_vocab_ranges(M, V, k, values, indices, logits, status, [&](int64_t v0, int64_t v1, float* block) {
    mtp::head_logits_packed_range(xn.data_ptr<float>(), M, H, panels.data_ptr(), bf16_rows ? &*bf16_rows : nullptr, V,
                                  v0, v1, block);
  }, lse);
}

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("mtp_head_topk_w4", &mtp_head_topk_w4_cpu);
  m.impl("mtp_head_topk_packed", &mtp_head_topk_packed_cpu);
  m.impl("mtp_head_topk", &mtp_head_topk_cpu);
  m.impl("mtp_input", &mtp_input_cpu);
}

}  // namespace specdec::ops
