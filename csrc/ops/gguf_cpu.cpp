// CPU glue of the `gguf` family: matmul and dequantisation straight from GGUF blocks
// (kernels: csrc/kernels/gguf/gguf_cpu.h). Rows of W are independent, so they are split over
// torch's threads; every output's accumulation order depends only on K.
#include "ops/aten.h"
#include <torch/library.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/gguf/gguf_cpu.h"
#include "kernels/gguf/q8.h"
#include "ops/gguf_common.h"
#include "ops/gguf_linear.h"
#include "ops/quant_parallel.h"

namespace specdec::ops {
namespace {

// Rows of W per thread chunk: at least 64 KiB of blocks, worth a thread start.
int64_t row_grain(int64_t row_bytes) { return std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(row_bytes, 1)); }

// The arguments of a matmul op (`op` names it in the messages): x (M, K) float32 / bfloat16 /
// float16, out a contiguous (M, N) tensor of x's dtype, the weight's blocks (N, K) of `type`, all
// on one device.
void check_matmul(const char* op, const at::Tensor& x, const at::Tensor& weight, int64_t type, const at::Tensor& out) {
  TORCH_CHECK(x.dim() == 2, op, ": x must be [M, K]; got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf, op,
              ": x must be float32, bfloat16 or float16; got ", x.scalar_type());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.scalar_type() == x.scalar_type() && out.is_contiguous(),
              op, ": out must be a contiguous [M=", x.size(0), ", N] tensor of x's dtype ", x.scalar_type(), "; got ",
              out.scalar_type(), " ", out.sizes());
  TORCH_CHECK(weight.device() == x.device() && out.device() == x.device(), op, ": x (", x.device(), "), weight (",
              weight.device(), ") and out (", out.device(), ") must be on one device");
  check_gguf_weight(op, weight, type, out.size(1), x.size(1));
}

void gguf_matmul_cpu(const at::Tensor& x, const at::Tensor& weight, int64_t type, at::Tensor& out) {
  // x: (M, K) float32 / bfloat16 / float16; weight: GGUF blocks of W (N, K); out: (M, N) of x's dtype
  check_matmul("gguf_matmul", x, weight, type, out);
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  if (M == 0 || N == 0) return;
  // bf16 / fp16 activations widen exactly; the float32 result is rounded once to x's dtype.
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  at::Tensor yf = out.scalar_type() == at::kFloat ? out : at::empty({M, N}, out.options().dtype(at::kFloat));
  const int32_t t = static_cast<int32_t>(type);
  const int64_t row_bytes = weight.numel() / N;
  parallel_range(0, N, row_grain(row_bytes), [&](int64_t begin, int64_t end) {
    gguf::matmul_cpu_rows(t, xf.data_ptr<float>(), M, K, weight.data_ptr<uint8_t>(), yf.data_ptr<float>(), N, begin,
                          end);
  });
  if (!yf.is_same(out)) out.copy_(yf);
}

// x: (M, K) float32 / bfloat16 / float16 -> (M, K) float32 contiguous (16-bit floats widen exactly).
at::Tensor q8_input(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2, op, ": x must be [M, K]; got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kHalf,
              op, ": x must be float32, bfloat16 or float16; got ", x.scalar_type());
  TORCH_CHECK(x.size(1) > 0 && x.size(1) % 32 == 0, op, ": K must be a positive multiple of 32 (the activation "
              "block); got x ", x.sizes());
  return x.to(at::kFloat).contiguous();
}

// Quantise rows [0, M) of xf [M, K] float32 into xq [M, q8_row_bytes(K)] over threads.
void quantize_q8_rows(const at::Tensor& xf, at::Tensor& xq) {
  const int64_t M = xf.size(0), K = xf.size(1), rb = gguf::q8_row_bytes(K);
  parallel_range(0, M, std::max<int64_t>(1, (16 << 10) / K), [&](int64_t begin, int64_t end) {
    gguf::quantize_rows_q8(xf.data_ptr<float>() + begin * K, end - begin, K, xq.data_ptr<uint8_t>() + begin * rb);
  });
}

void gguf_quantize_q8_cpu(const at::Tensor& x, at::Tensor& out) {
  // x: (M, K) float32 / bfloat16 / float16; out: (M, q8_row_bytes(K)) uint8
  const at::Tensor xf = q8_input("gguf_quantize_q8", x);
  const int64_t M = xf.size(0), K = xf.size(1);
  TORCH_CHECK(out.dim() == 2 && out.size(0) == M && out.size(1) == gguf::q8_row_bytes(K) &&
                  out.scalar_type() == at::kByte && out.is_contiguous() && out.device() == x.device(),
              "gguf_quantize_q8: out must be a contiguous uint8 [M=", M, ", q8_row_bytes(", K, ")=",
              gguf::q8_row_bytes(K), "] tensor on x's device; got ", out.scalar_type(), " ", out.sizes());
  if (M == 0) return;
  quantize_q8_rows(xf, out);
}

void gguf_matmul_q8_cpu(const at::Tensor& x, const at::Tensor& weight, int64_t type, at::Tensor& out) {
  // x: (M, K) float32 / bfloat16 / float16; weight: GGUF blocks of W (N, K); out: (M, N) of x's dtype
  const at::Tensor xf = q8_input("gguf_matmul_q8", x);
  check_matmul("gguf_matmul_q8", x, weight, type, out);
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  if (M == 0 || N == 0) return;
  // x is quantised once; every thread reads the same Q8 rows against its own rows of W.
  at::Tensor xq = at::empty({M, gguf::q8_row_bytes(K)}, x.options().dtype(at::kByte));
  quantize_q8_rows(xf, xq);
  at::Tensor yf = out.scalar_type() == at::kFloat ? out : at::empty({M, N}, out.options().dtype(at::kFloat));
  const int32_t t = static_cast<int32_t>(type);
  parallel_range(0, N, row_grain(weight.numel() / N), [&](int64_t begin, int64_t end) {
    gguf::matmul_q8_cpu_rows(t, xq.data_ptr<uint8_t>(), M, K, weight.data_ptr<uint8_t>(), yf.data_ptr<float>(), N,
                             begin, end);
  });
  if (!yf.is_same(out)) out.copy_(yf);
}

void gguf_linear_cpu(const at::Tensor& x, at::TensorList weights, at::IntArrayRef types,
                     const std::optional<at::Tensor>& bias, int64_t activations, at::Tensor& out) {
  // x: (M, K) float32; weights: GGUF parts of W (N, K), concatenated along N; bias: (N,) float32
  // or None; activations: 0 float32, 1 Q8 (ops/gguf_linear.h); out: (M, N) float32
  constexpr const char* op = "gguf_linear";
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(), op,
              ": x must be a contiguous float32 [M, K] CPU tensor; got ", x.scalar_type(), " ", x.sizes(), " on ",
              x.device());
  TORCH_CHECK(out.dim() == 2 && out.size(0) == x.size(0) && out.scalar_type() == at::kFloat && out.is_contiguous() &&
                  out.device().is_cpu(),
              op, ": out must be a contiguous float32 [M=", x.size(0), ", N] CPU tensor; got ", out.scalar_type(), " ",
              out.sizes());
  const int64_t M = x.size(0), K = x.size(1), N = out.size(1);
  const std::vector<GgufPart> parts = check_gguf_parts(op, "the weight", weights, types, N, K);
  if (bias.has_value())
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->sizes() == at::IntArrayRef{N}, op,
                ": bias must be a contiguous float32 [", N, "] tensor; got ", bias->scalar_type(), " ", bias->sizes());
  gguf_linear(x.data_ptr<float>(), M, K, parts, bias.has_value() ? bias->data_ptr<float>() : nullptr,
              out.data_ptr<float>(), N, gguf_activations(op, activations));
}

void gguf_repack_panels_cpu(const at::Tensor& weight, int64_t type, int64_t K, bool inverse, at::Tensor& out) {
  // weight: GGUF blocks of W (N, K), or (inverse) their panels; out: the same shape and dtype
  constexpr const char* op = "gguf_repack_panels";
  const int32_t file = gguf::file_type(static_cast<int32_t>(type));
  const bool file_format = type == 3 || type == 6 || type == 8 || type == 12 || type == 14;
  TORCH_CHECK(inverse ? gguf::is_panels(static_cast<int32_t>(type)) : file_format, op, ": type must be ",
              inverse ? "a panel layout (515, 518, 520, 524, 526)" : "Q4_1, Q5_0, Q8_0, Q4_K or Q6_K (3, 6, 8, 12, 14)",
              " with inverse=", inverse ? "True" : "False", "; got ", type);
  TORCH_CHECK(weight.dim() == 2, op, ": weight must be the [N, row bytes] uint8 blocks of a ", gguf_type_name(type),
              " weight; got ", weight.sizes());
  const int64_t N = weight.size(0);
  check_gguf_weight(op, weight, type, N, K, /*panels=*/true);
  TORCH_CHECK(N % gguf::kPanelRows == 0, op, ": panels hold whole groups of ", gguf::kPanelRows, " rows; got N = ", N);
  TORCH_CHECK(out.sizes() == weight.sizes() && out.scalar_type() == at::kByte && out.is_contiguous() &&
                  out.device().is_cpu() && out.data_ptr() != weight.data_ptr(),
              op, ": out must be a contiguous uint8 CPU tensor shaped like weight ", weight.sizes(),
              " (not weight itself); got ", out.scalar_type(), " ", out.sizes());
  if (N == 0) return;
  const int64_t rb = weight.size(1);
  uint8_t* w = weight.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  parallel_range(0, N / gguf::kPanelRows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      uint8_t* src = w + g * gguf::kPanelRows * rb;
      uint8_t* dst = o + g * gguf::kPanelRows * rb;
      if (inverse) {
        gguf::blocks_from_panels(static_cast<int32_t>(type), src, rb, dst);
      } else {
        gguf::panels_of_group(file, src, rb, dst);
      }
    }
  });
}

void gguf_dequantize_cpu(const at::Tensor& weight, int64_t type, at::Tensor& out) {
  // weight: GGUF blocks of W (N, K); out: (N, K) float32 or bfloat16
  TORCH_CHECK(out.dim() == 2 && out.is_contiguous() &&
                  (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16),
              "gguf_dequantize: out must be a contiguous float32 or bfloat16 [N, K] tensor on the CPU; got ",
              out.scalar_type(), " ", out.sizes());
  TORCH_CHECK(weight.device() == out.device(), "gguf_dequantize: weight (", weight.device(), ") and out (",
              out.device(), ") must be on one device");
  const int64_t N = out.size(0), K = out.size(1);
  check_gguf_weight("gguf_dequantize", weight, type, N, K, /*panels=*/true);
  if (N == 0) return;
  if (gguf::is_panels(static_cast<int32_t>(type))) {  // via the file's order (not a decoding path)
    at::Tensor rows = at::empty(weight.sizes(), weight.options());
    gguf_repack_panels_cpu(weight, type, K, true, rows);
    gguf_dequantize_cpu(rows, gguf::file_type(static_cast<int32_t>(type)), out);
    return;
  }
  const int32_t t = static_cast<int32_t>(type);
  const uint8_t* w = weight.data_ptr<uint8_t>();
  parallel_range(0, N, row_grain(weight.numel() / N), [&](int64_t begin, int64_t end) {
    if (out.scalar_type() == at::kFloat) {
      gguf::dequantize_cpu_rows(t, w, K, out.data_ptr<float>(), begin, end);
    } else {
      gguf::dequantize_cpu_rows_bf16(t, w, K, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), begin, end);
    }
  });
}

void gguf_repack_lanes_cpu(const at::Tensor& weight, int64_t type, int64_t K, at::Tensor& out) {
  // weight: Q4_K or Q6_K blocks of W (N, K); out: the same shape and dtype, Q4_K_LANES / Q6_K_LANES
  TORCH_CHECK(type == 12 || type == 14, "gguf_repack_lanes: type must be Q4_K (12) or Q6_K (14); got ", type);
  TORCH_CHECK(weight.dim() == 2, "gguf_repack_lanes: weight must be the [N, row bytes] uint8 blocks of a ",
              gguf_type_name(type), " weight; got ", weight.sizes());
  const int64_t N = weight.size(0);
  check_gguf_weight("gguf_repack_lanes", weight, type, N, K);
  TORCH_CHECK(out.sizes() == weight.sizes() && out.scalar_type() == at::kByte && out.is_contiguous() &&
                  out.device().is_cpu() && out.data_ptr() != weight.data_ptr(),
              "gguf_repack_lanes: out must be a contiguous uint8 CPU tensor shaped like weight ", weight.sizes(),
              " (not weight itself); got ", out.scalar_type(), " ", out.sizes());
  if (N == 0) return;
  const int64_t row_bytes = weight.size(1);
  const uint8_t* w = weight.data_ptr<uint8_t>();
  uint8_t* o = out.data_ptr<uint8_t>();
  parallel_range(0, N, row_grain(row_bytes), [&](int64_t begin, int64_t end) {
    if (type == 12) {
      for (int64_t b = begin * row_bytes; b < end * row_bytes; b += sizeof(gguf::BlockQ4_K)) {
        std::memcpy(o + b, w + b, 16);  // d, dmin, scales
        gguf::q4k_qs_to_lanes(w + b + 16, o + b + 16);
      }
    } else {
      for (int64_t b = begin * row_bytes; b < end * row_bytes; b += sizeof(gguf::BlockQ6_K)) {
        gguf::BlockQ6_K in, lanes;
        std::memcpy(&in, w + b, sizeof(in));
        gguf::q6k_recode(in, lanes, false);
        std::memcpy(o + b, &lanes, sizeof(lanes));
      }
    }
  });
}

void gguf_cpu_isa(at::Tensor& code) {
  // code: (1,) int32
  TORCH_CHECK(code.numel() == 1 && code.scalar_type() == at::kInt, "_gguf_cpu_isa: code must be one int32; got ",
              code.scalar_type(), " ", code.sizes());
  const std::string isa = gguf::matmul_cpu_isa();
  code.fill_(isa == "avx512" ? 2 : isa == "avx2" ? 1 : 0);
}

void gguf_q8_cpu_isa(at::Tensor& code) {
  // code: (1,) int32
  TORCH_CHECK(code.numel() == 1 && code.scalar_type() == at::kInt, "_gguf_q8_cpu_isa: code must be one int32; got ",
              code.scalar_type(), " ", code.sizes());
  const std::string isa = gguf::matmul_q8_cpu_isa();
  code.fill_(isa == "avx512-vnni" ? 3 : isa == "avx512" ? 2 : isa == "avx2" ? 1 : 0);
}

}  // namespace

TORCH_LIBRARY_IMPL(specdec, CPU, m) {
  m.impl("gguf_matmul", &gguf_matmul_cpu);
  m.impl("gguf_dequantize", &gguf_dequantize_cpu);
  m.impl("gguf_repack_lanes", &gguf_repack_lanes_cpu);
  m.impl("gguf_repack_panels", &gguf_repack_panels_cpu);
  m.impl("gguf_linear", &gguf_linear_cpu);
  m.impl("_gguf_cpu_isa", &gguf_cpu_isa);
  m.impl("gguf_matmul_q8", &gguf_matmul_q8_cpu);
  m.impl("gguf_quantize_q8", &gguf_quantize_q8_cpu);
  m.impl("_gguf_q8_cpu_isa", &gguf_q8_cpu_isa);
}

}  // namespace specdec::ops
