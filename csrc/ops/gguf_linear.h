// y [M, N] = x [M, K] · Wᵀ (+ bias) where W is the concatenation, along N, of one or more GGUF
// weights (parts) read as stored in the file: what the gguf_linear op and the decoder_layer_gguf
// op both run. A GGUF file quantises q, k and v (and gate, up) as separate tensors, often in
// different formats (Qwen2.5's Q4_K_M file: q, k in Q4_K, v in Q6_K in half the layers), so a
// fused projection is a list of parts rather than one tensor.
//
//   parts:  [ W_0 : N_0 rows ][ W_1 : N_1 rows ] ...     N = sum N_p
//   y[m, o_p + n] = x[m] · W_p[n]   (o_p = N_0 + ... + N_{p-1})
//
// The rows of all parts form one range [0, N), claimed by threads in chunks (ops/claim_parallel.h:
// no wait for a helper the OS has not scheduled); a chunk may span two parts. Each output is
// computed whole by one thread in the kernels' fixed order, the bias added last: the bits do not
// depend on M, on the thread count or on the chunking. The caller has checked the shapes
// (check_gguf_parts).
//
// Activations: float32 (kernels/gguf/gguf_cpu.h: x as it is, float FMAs), or Q8
// (kernels/gguf/q8.h: each row of x quantised once per call to int8 blocks of 32 with a float32
// scale, integer dot products; ~3x the float kernel's speed on Q4_K, and llama.cpp's numerics).
// Either way a row's result is a function of that row alone. Or, on AMX CPUs, bfloat16 tiles
// (kernels/gguf/bf16_amx.h: x and W rounded to bfloat16, tile products): a contract of its own,
// also row-independent, for a prompt's prefill only (never mixed with the other two within one
// sequence's verification rows). Or, on CPUs with AVX-512 VNNI and no AMX, Q8K (kernels/gguf/q8k.h:
// x with one int8 scale per 256 values, the k-quants' sub-block scales in integers): likewise a
// prefill-only contract; a part in a legacy format runs that contract's legacy order over x's Q8
// form (q8k.h) within the same call. Or Q8K + Q8 (kQ8kQ8): the k-quant parts in Q8K, the legacy
// ones in Q8, every row a one-row call's bits: the decoding mode of a model that holds its
// weights in panels of 16 rows (kernels/gguf/panels.h). Panels are read natively by the int8
// kernels on VNNI CPUs and by the AMX tiles, through the file's order by the others (gguf_part_rows).
#pragma once

#include "ops/aten.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/gguf/bf16_amx.h"
#include "kernels/gguf/blocks.h"
#include "kernels/gguf/gguf_cpu.h"
#include "kernels/gguf/q8.h"
#include "kernels/gguf/panels.h"
#include "kernels/gguf/q8k.h"
#include "ops/claim_parallel.h"
#include "ops/gguf_common.h"

namespace specdec::ops {

// kQ8kQ8: a model's decoding mode where its weights are panels (kernels/gguf/panels.h):
// the k-quant parts in the Q8K order, the legacy ones in Q8's; like kQ8 and kFloat32 it gives every
// row the bits of a one-row call, so verification rows keep decoding's bits.
enum class GgufActivations : int64_t { kFloat32 = 0, kQ8 = 1, kBf16Amx = 2, kQ8k = 3, kQ8kQ8 = 4 };

inline GgufActivations gguf_activations(const char* op, int64_t code) {
  TORCH_CHECK(code >= 0 && code <= 4, op,
              ": activations must be 0 (float32), 1 (Q8), 2 (bfloat16 AMX tiles), 3 (Q8K prefill) or 4 (Q8K "
              "k-quants, Q8 legacy blocks); got ", code);
  TORCH_CHECK(code != 2 || gguf::bf16_amx_enabled(), op,
              ": activations 2 (bfloat16 AMX tiles) needs a CPU with AMX-BF16 that SPECDEC_CPU_ISA allows");
  return static_cast<GgufActivations>(code);
}

struct GgufPart {
  const uint8_t* data;  // rows * row_bytes bytes
  int32_t type;         // ggml type id
  int64_t rows;         // N_p
  int64_t row_bytes;    // K / QK * block bytes
};

// The parts of a [N, K] weight: weights[p] is part p's blocks (uint8 [N_p, row bytes]), types[p]
// its type id; their rows must add up to N. `op` and `name` go into the messages.
inline std::vector<GgufPart> check_gguf_parts(const char* op, const char* name, at::TensorList weights,
                                              at::IntArrayRef types, int64_t N, int64_t K) {
  TORCH_CHECK(!weights.empty() && weights.size() == types.size(), op, ": ", name, " needs one type id per part; got ",
              weights.size(), " parts and ", types.size(), " types");
  std::vector<GgufPart> parts;
  int64_t rows = 0;
  for (size_t p = 0; p < weights.size(); ++p) {
    const at::Tensor& w = weights[p];
    TORCH_CHECK(w.device().is_cpu() && w.dim() == 2, op, ": ", name, " part ", p,
                " must be a [rows, row bytes] uint8 CPU tensor; got ", w.sizes(), " on ", w.device());
    check_gguf_weight(op, w, types[p], w.size(0), K, /*panels=*/true);
    const int32_t t = static_cast<int32_t>(types[p]);
    parts.push_back({w.data_ptr<uint8_t>(), t, w.size(0), K / gguf::block_weights(t) * gguf::block_bytes(t)});
    rows += w.size(0);
  }
  TORCH_CHECK(rows == N, op, ": the parts of ", name, " hold ", rows, " rows; expected ", N);
  return parts;
}

// The x forms one call needs, each made once (nullptr: not needed).
struct GgufInputs {
  const float* x;     // [M, K] float32
  const uint8_t* xq;  // their Q8 form (q8.h)
  const uint16_t* xv; // their bfloat16 tile form (bf16_amx.h)
  const uint16_t* xr; // their bfloat16 rows, for weights in panels (bf16_amx.h)
  const uint8_t* xk;  // their Q8K form (q8k.h)
};

// Rows [lo, hi) of one part, y[m * N + n] at y's row 0 of the part, in `mode`. Panels
// (kernels/gguf/panels.h) go to the kernels of their mode, which read them natively where the CPU
// has AVX-512 VNNI, and the AMX tiles' panel kernel (a prompt's prefill of a model in panels);
// the float32 kernels, and the int8 ones without VNNI, get each group of 16 rows back in the
// file's order here (not decoding paths: the models hold panels only where VNNI reads them).
inline void gguf_part_rows(const GgufInputs& in, GgufActivations mode, int32_t type, const uint8_t* data,
                           int64_t row_bytes, int64_t M, int64_t K, float* y, int64_t N, int64_t lo, int64_t hi) {
  const bool q8k_modes = mode == GgufActivations::kQ8k || mode == GgufActivations::kQ8kQ8;
  if (q8k_modes && gguf::q8k_supported(type)) {
    gguf::matmul_q8k_rows(type, in.xk, M, K, data, y, N, lo, hi);
  } else if (mode == GgufActivations::kQ8k) {
    gguf::matmul_q8k_legacy_rows(type, in.xq, M, K, data, y, N, lo, hi);
  } else if (mode == GgufActivations::kQ8 || mode == GgufActivations::kQ8kQ8) {
    gguf::matmul_q8_cpu_rows(type, in.xq, M, K, data, y, N, lo, hi);
  } else if (mode == GgufActivations::kBf16Amx && gguf::is_panels(type)) {
    gguf::matmul_bf16_amx_panel_rows(type, in.xr, M, K, data, y, N, lo, hi);
  } else if (gguf::is_panels(type)) {
    gguf::panel_groups_in_file_order(type, data, row_bytes, lo, hi,
                                     [&](int32_t file, const uint8_t* rows, int64_t g0, int64_t a, int64_t b) {
                                       gguf_part_rows(in, mode, file, rows, row_bytes, M, K, y + g0, N, a, b);
                                     });
  } else if (mode == GgufActivations::kBf16Amx) {
    gguf::matmul_bf16_amx_rows(type, in.xv, M, K, data, y, N, lo, hi);
  } else {
    gguf::matmul_cpu_rows(type, in.x, M, K, data, y, N, lo, hi);
  }
}

// Rows [begin, end) of the concatenated weight: y[m * N + n] for every m, the bias added last.
inline void gguf_linear_rows(const GgufInputs& in, GgufActivations mode, int64_t M, int64_t K,
                             const std::vector<GgufPart>& parts, const float* bias, float* y, int64_t N,
                             int64_t begin, int64_t end) {
  int64_t offset = 0;
  for (const GgufPart& part : parts) {
    const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + part.rows);
    if (lo < hi)
      gguf_part_rows(in, mode, part.type, part.data, part.row_bytes, M, K, y + offset, N, lo - offset, hi - offset);
    offset += part.rows;
  }
  if (bias != nullptr)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = begin; n < end; ++n) y[m * N + n] += bias[n];
}

inline void gguf_linear(const float* x, int64_t M, int64_t K, const std::vector<GgufPart>& parts, const float* bias,
                        float* y, int64_t N, GgufActivations activations) {
  if (M == 0 || N == 0) return;
  // x's Q8 or tile form, made once per call on the calling thread (M rows of K values, little next
  // to the weights), in buffers kept per thread: a prefill's would otherwise be fresh pages per call.
  static thread_local std::vector<uint8_t> xq_buf, xk_buf;
  static thread_local std::vector<uint16_t> xv_buf, xr_buf;
  GgufInputs in{x, nullptr, nullptr, nullptr, nullptr};
  // In the Q8K modes: x's Q8K form for the k-quant parts, its Q8 form for the legacy ones.
  const bool q8k = activations == GgufActivations::kQ8k || activations == GgufActivations::kQ8kQ8;
  bool any_kquant = false, all_kquant = true, any_panels = false, all_panels = true;
  for (const GgufPart& part : parts) {
    any_kquant = any_kquant || gguf::q8k_supported(part.type);
    all_kquant = all_kquant && gguf::q8k_supported(part.type);
    any_panels = any_panels || gguf::is_panels(part.type);
    all_panels = all_panels && gguf::is_panels(part.type);
  }
  if (q8k && any_kquant) {  // k-quant rows are whole super-blocks: K % 256 == 0
    const size_t need = static_cast<size_t>(M * gguf::q8k_row_bytes(K));
    if (xk_buf.size() < need) xk_buf.resize(need);
    gguf::quantize_rows_q8k(x, M, K, xk_buf.data());
    in.xk = xk_buf.data();
  }
  if (activations == GgufActivations::kQ8 || (q8k && !all_kquant)) {
    const size_t need = static_cast<size_t>(M * gguf::q8_row_bytes(K));
    if (xq_buf.size() < need) xq_buf.resize(need);
    gguf::quantize_rows_q8(x, M, K, xq_buf.data());
    in.xq = xq_buf.data();
  } else if (activations == GgufActivations::kBf16Amx) {  // the tiles' x forms: file order, panels
    if (!all_panels) {
      const size_t need = static_cast<size_t>(gguf::bf16_amx_rows_size(M, K));
      if (xv_buf.size() < need) xv_buf.resize(need);
      gguf::bf16_amx_prepare(x, M, K, xv_buf.data());
      in.xv = xv_buf.data();
    }
    if (any_panels) {
      const size_t need = static_cast<size_t>(gguf::bf16_amx_panel_rows_size(M, K));
      if (xr_buf.size() < need) xr_buf.resize(need);
      gguf::bf16_amx_prepare_panel_rows(x, M, K, xr_buf.data());
      in.xr = xr_buf.data();
    }
  }
  // Rows claimed in chunks of 256 KiB .. 2 MiB of blocks (streaming_grain, at the parts' mean row size);
  // the tile kernel decodes W 32 rows at a time, so its chunks are whole groups of 32.
  int64_t bytes = 0;
  for (const GgufPart& part : parts) bytes += part.rows * part.row_bytes;
  int64_t grain = streaming_grain(N, bytes / N);
  if (in.xv != nullptr || in.xr != nullptr) grain = (grain + 31) / 32 * 32;
  // The Q8K kernels decode W, and panels hold it, 16 rows at a time.
  if (q8k || any_panels) grain = (grain + 15) / 16 * 16;
  claim_parallel_range(0, N, grain, [&](int64_t begin, int64_t end) {
    gguf_linear_rows(in, activations, M, K, parts, bias, y, N, begin, end);
  });
}

}  // namespace specdec::ops
