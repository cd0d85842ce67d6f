// CPU glue of the `mtp` family: fused MTP-head output side (norm + LM head + top-k) and input side
// (embedding gather + two norms + split eh_proj). Kernels: csrc/kernels/mtp/mtp_cpu.h.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>

#include "kernels/common/dtype.h"
#include "kernels/common/status.h"
#include "kernels/mtp/mtp_cpu.h"
#include "ops/mtp_common.h"
#include "ops/quant_parallel.h"

namespace specdec::ops {
namespace {

// Vocabulary rows per range: 256 rows x H = 4096 x 4 B = 4 MiB of lm_head, tens of microseconds;
// small vocabularies run as one range.
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

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("mtp_head_topk", &mtp_head_topk_cpu);
  m.impl("mtp_input", &mtp_input_cpu);
}

}  // namespace specdec::ops
