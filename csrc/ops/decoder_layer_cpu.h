// The decoder_layer and context_kv ops' CPU implementations, for glue that runs them inside one op
// (the DFlash drafter's block and extend, ops/dflash_cpu.cpp) without a trip through the dispatcher.
#pragma once

#include "ops/aten.h"

#include <optional>

namespace specdec::ops {

// Arguments and shapes as the decoder_layer op's schema (ops/schema.cpp) gives them; checks them.
void decoder_layer_cpu(const at::Tensor& x, const at::Tensor& norm1, const at::Tensor& norm2, double norm_eps,
                       const at::Tensor& qkv_w, const std::optional<at::Tensor>& qkv_b, const at::Tensor& o_w,
                       const std::optional<at::Tensor>& o_b, const at::Tensor& gate_up_w,
                       const std::optional<at::Tensor>& gate_up_b, const at::Tensor& down_w,
                       const std::optional<at::Tensor>& down_b, const std::optional<at::Tensor>& q_norm,
                       const std::optional<at::Tensor>& k_norm, const at::Tensor& cos, const at::Tensor& sin,
                       at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& lengths,
                       const std::optional<at::Tensor>& tree_mask, int64_t num_heads, int64_t num_kv_heads,
                       double sm_scale, at::Tensor& out, int64_t activations);

// Arguments and shapes as the context_kv op's schema (ops/schema.cpp) gives them; checks them.
void context_kv_cpu(const at::Tensor& hidden, const at::Tensor& fc_w, const at::Tensor& context_norm,
                    const at::Tensor& kv_w, const std::optional<at::Tensor>& kv_b, const at::Tensor& k_norm,
                    double norm_eps, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& k_cache,
                    at::Tensor& v_cache, const at::Tensor& lengths);

}  // namespace specdec::ops
