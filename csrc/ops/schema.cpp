// The one schema file: every op of the `specdec` library is declared here, grouped by family.
// Implementations register under the same names in <family>_cpu.cpp and <family>_cuda.cpp
// (TORCH_LIBRARY_IMPL(specdec, CPU|CUDA)); fake kernels live next to the Python API in
// python/specdec_cuda/ops/<family>.py. Outputs are allocated by the Python layer and written in
// place, marked `(a!)` in the schema, so the ops capture in CUDA graphs and trace under
// torch.compile.
//
// Keep each family in its own block below; add a family as a new block.
#include <torch/library.h>

TORCH_LIBRARY(specdec, m) {
  // ---- family: sampling (csrc/kernels/sampling, ops/sampling_{cpu,cuda}.cpp) ----
  // sample: one token per logit row.
  m.def(
      "sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor seed, "
      "Tensor position, int purpose, int substream, Tensor(a!) tokens, Tensor(b!) status) -> ()");
  // verify_chain: a ragged batch of draft chains in one call. strategy: 0 auto, 1 parallel,
  // 2 serial.
  m.def(
      "verify_chain(Tensor draft_tokens, Tensor cu_num_draft, Tensor target_logits, "
      "Tensor? draft_logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor seed, "
      "Tensor position, bool typical, float typical_epsilon, float typical_alpha, int strategy, "
      "Tensor(a!) tokens, Tensor(b!) num_accepted, Tensor(c!) accepted, Tensor(d!) status) -> ()");
  // ---- end family: sampling ----

  // ---- family: tree (csrc/kernels/tree, ops/tree_{cpu,cuda}.cpp) ----
  // build_tree: depth, positions, attention masks and child/sibling links of a ragged batch of
  // parent-array trees (layout: python/specdec_cuda/reference/tree.py).
  m.def(
      "build_tree(Tensor parents, Tensor cu_num_nodes, Tensor cache_len, int max_prefix, "
      "Tensor(a!) depth, Tensor(b!) positions, Tensor(c!) tree_mask, Tensor(d!) packed_mask, "
      "Tensor(e!) first_child, Tensor(f!) next_sibling, Tensor(g!)? hf_mask, "
      "Tensor(h!) status) -> ()");
  // verify_tree: greedy / SpecInfer (draft logits) / one-hot (no draft logits) tree walks.
  m.def(
      "verify_tree(Tensor draft_tokens, Tensor parents, Tensor cu_num_nodes, Tensor target_logits, "
      "Tensor? draft_logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor seed, "
      "Tensor position, Tensor(a!) tokens, Tensor(b!) accepted_nodes, Tensor(c!) num_accepted, "
      "Tensor(d!) status) -> ()");
  // compact_kv: move each row's accepted nodes' K/V to contiguous slots, every cache tensor at once.
  m.def(
      "compact_kv(Tensor(a!)[] caches, Tensor accepted_nodes, Tensor num_accepted, "
      "Tensor src_start, Tensor dst_start, Tensor(b!) status) -> ()");
  // lookahead_mask: positions and attention mask of a lookahead-decoding step (root, G guess
  // chains, a W x L Jacobi window; layout in kernels/tree/lookahead_mask.h).
  m.def(
      "lookahead_mask(Tensor cache_len, Tensor guess_lens, int guess_len, int window, int levels, "
      "Tensor(a!) positions, Tensor(b!) tree_mask, Tensor(c!) status) -> ()");
  // ---- end family: tree ----

  // ---- family: quant (csrc/kernels/quant, ops/quant_{cpu,cuda}.cpp) ----
  // w4a16_matmul: out = x · dequant(W)ᵀ, W packed in `layout` (0 LAYOUT_CPU, 1 LAYOUT_CUDA, see
  // reference/quant.py); group_size -1 = per channel.
  m.def(
      "w4a16_matmul(Tensor x, Tensor packed, Tensor scales, int group_size, int layout, "
      "Tensor(a!) out) -> ()");
  // w4_dequantize: the dense weight [N, K] of a packed one.
  m.def(
      "w4_dequantize(Tensor packed, Tensor scales, int group_size, int layout, "
      "Tensor(a!) weight) -> ()");
  // _w4a16_matmul_tuned: w4a16_matmul through one entry of the CUDA kernel's launch-configuration
  // table (-1: the automatic choice); for tuning sweeps (bench/bench_quant.py --tune). CUDA only.
  m.def(
      "_w4a16_matmul_tuned(Tensor x, Tensor packed, Tensor scales, int group_size, int tuning, "
      "Tensor(a!) out) -> ()");
  // ---- end family: quant ----

  // ---- family: kv_quant (csrc/kernels/kv_quant, ops/kv_quant_{cpu,cuda}.cpp) ----
  // Hierarchical 4-bit KV cache (reference/kv_quant.py). Quantise a block of keys (grouped along
  // tokens) / values (grouped along channels) into the cache at token `start[b]` of each row.
  m.def(
      "kv_quantize_keys(Tensor k, Tensor start, int group_size, Tensor(a!) k_upper, "
      "Tensor(b!) k_lower, Tensor(c!) k_scale, Tensor(d!) k_zero) -> ()");
  m.def(
      "kv_quantize_values(Tensor v, Tensor start, int group_size, Tensor(a!) v_upper, "
      "Tensor(b!) v_lower, Tensor(c!) v_scale, Tensor(d!) v_zero) -> ()");
  // Read tokens [0, out.size(2)) back, upper only or upper + lower (lower ignored when
  // use_lower is false).
  m.def(
      "kv_dequantize_keys(Tensor k_upper, Tensor k_lower, Tensor k_scale, Tensor k_zero, "
      "int group_size, bool use_lower, Tensor(a!) out) -> ()");
  m.def(
      "kv_dequantize_values(Tensor v_upper, Tensor v_lower, Tensor v_scale, Tensor v_zero, "
      "int group_size, bool use_lower, Tensor(a!) out) -> ()");
  // ---- end family: kv_quant ----

  // ---- family: quant_attention (csrc/kernels/quant_attention, ops/quant_attention_{cpu,cuda}.cpp) ----
  // Attention of n new tokens over the hierarchical 4-bit cache plus its float32 buffer
  // (reference/quant_attention.py): query i reads tokens < quant_len[b, i] from the codes (upper
  // only or upper + lower), later ones from buffer slot t - buffer_start[b]; causal or tree mask
  // over the new tokens at lengths[b] + j. out (B, Hq, n, D) is written.
  m.def(
      "quant_kv_attention(Tensor q, Tensor k_upper, Tensor k_lower, Tensor k_scale, Tensor k_zero, "
      "Tensor v_upper, Tensor v_lower, Tensor v_scale, Tensor v_zero, Tensor k_buffer, Tensor v_buffer, "
      "Tensor quant_len, Tensor buffer_start, Tensor lengths, Tensor? tree_mask, int key_group, "
      "int value_group, bool use_lower, float sm_scale, Tensor(a!) out) -> ()");
  // ---- end family: quant_attention ----

  // ---- family: skinny_linear (csrc/kernels/skinny_linear, ops/skinny_linear_cpu.cpp; CPU only) ----
  // skinny_linear: out = x · weightᵀ (+ bias) in float32 for a few rows of x, each output row
  // computed independently of the others (reference/skinny_linear.py).
  m.def("skinny_linear(Tensor x, Tensor weight, Tensor? bias, Tensor(a!) out) -> ()");
  // skinny_linear_packed: the same product from a weight packed once into column panels
  // [ceil(N / 64), K, 64] (float32, or bfloat16 widened exactly); x [..., K], out [..., N].
  // `rounded`: bfloat16 panels on the AMX tier multiply x rounded to bfloat16 (one tile product per
  // weight; kernels/skinny_linear/packed_cpu.h); the FMA tiers ignore it.
  m.def("skinny_linear_packed(Tensor x, Tensor packed, Tensor? bias, Tensor(a!) out, bool rounded=False) -> ()");
  // ---- end family: skinny_linear ----

  // ---- family: decoder_layer (csrc/kernels/decoder_layer, ops/decoder_layer_cpu.cpp; CPU only) ----
  // decoder_layer: one Llama/Qwen decoder layer (RMSNorm, packed q|k|v projection, q/k norm,
  // RoPE, K/V to the cache's pending slots lengths[b] + i, attention over the cache with a causal
  // or tree mask among the new tokens, o projection, residual, RMSNorm, SwiGLU with packed
  // projections, residual) over x (B, n, hidden); out is written, the caches' pending slots too
  // (reference/decoder_layer.py). activations 1: bfloat16 panels take x rounded to bfloat16 on the
  // AMX tier (a prompt's prefill), 0 (default) exactly.
  m.def(
      "decoder_layer(Tensor x, Tensor norm1, Tensor norm2, float norm_eps, Tensor qkv_w, Tensor? qkv_b, "
      "Tensor o_w, Tensor? o_b, Tensor gate_up_w, Tensor? gate_up_b, Tensor down_w, Tensor? down_b, "
      "Tensor? q_norm, Tensor? k_norm, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor lengths, Tensor? tree_mask, int num_heads, int num_kv_heads, float sm_scale, Tensor(c!) out, "
      "int activations=0) -> ()");
  // decoder_layer_gguf: the same layer with its projections in GGUF blocks as stored in the file:
  // weights lists the parts of q|k|v, o, gate|up and down in order (parts[p] of projection p, each
  // uint8 [rows, row bytes], concatenated along the outputs), types their ggml type ids;
  // activations as gguf_linear's.
  m.def(
      "decoder_layer_gguf(Tensor x, Tensor norm1, Tensor norm2, float norm_eps, Tensor[] weights, int[] types, "
      "int[] parts, int activations, Tensor? qkv_b, Tensor? o_b, Tensor? gate_up_b, Tensor? down_b, Tensor? q_norm, Tensor? k_norm, "
      "Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor lengths, Tensor? tree_mask, "
      "int num_heads, int num_kv_heads, float sm_scale, Tensor(c!) out) -> ()");
  // context_kv: KV injection's context keys and values (the DFlash drafter): feats =
  // RMSNorm(hidden · fc_wᵀ) with context_norm, then per drafter layer l its k|v projection
  // (rows l * 2 Hkv D of kv_w), k RMS-normalised by k_norm[l] and rotated by RoPE, written to
  // k_cache[l] / v_cache[l] (layers, B, Hkv, T, D) at slots lengths[b] + i. hidden (B, n,
  // features) float32; fc_w, kv_w packed (reference/decoder_layer.py).
  m.def(
      "context_kv(Tensor hidden, Tensor fc_w, Tensor context_norm, Tensor kv_w, Tensor? kv_b, Tensor k_norm, "
      "float norm_eps, Tensor cos, Tensor sin, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor lengths) -> ()");
  // ---- end family: decoder_layer ----

  // ---- family: dflash (ops/dflash_cpu.cpp; CPU only) ----
  // dflash_block_topk: the DFlash drafter's block forward for a draft, one op: anchors' embeddings
  // into row 0 of block (B, n, H) (its MASK rows as given), per layer the decoder_layer op over
  // that layer's cache with the block seeing itself whole (layers: 12 weights per layer, norm1,
  // norm2, qkv_w, qkv_b, o_w, o_b, gate_up_w, gate_up_b, down_w, down_b, q_norm, k_norm; RoPE rows
  // lengths[b] + i of the (P, D) tables), then rows 1 .. depth through the final norm and the
  // packed LM head's top-k: values (B, depth, k) (log-probabilities with log_probs), token ids
  // (B, depth, k) (through vocab_ids when given), status (B * depth,) (models/dflash.py's torch path).
  m.def(
      "dflash_block_topk(Tensor anchors, Tensor embed, Tensor(a!) block, Tensor rope_cos, Tensor rope_sin, "
      "Tensor?[] layers, float norm_eps, Tensor(b!)[] k_caches, Tensor(c!)[] v_caches, Tensor lengths, "
      "int num_heads, float sm_scale, int depth, Tensor final_norm, Tensor head, int vocab_size, "
      "Tensor? vocab_ids, int k, bool log_probs) -> (Tensor, Tensor, Tensor)");
  // dflash_extend: the drafter's cache extended by committed tokens: hidden (per target layer read,
  // (B, n, H_l), concatenated along features) through context_kv with the RoPE rows lengths[b] + i
  // of the (P, D) tables, then lengths[b] += num_new[b] (models/dflash.py's torch path).
  m.def(
      "dflash_extend(Tensor[] hidden, Tensor fc_w, Tensor context_norm, Tensor kv_w, Tensor? kv_b, Tensor k_norm, "
      "float norm_eps, Tensor rope_cos, Tensor rope_sin, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor(c!) lengths, Tensor num_new) -> ()");
  // ---- end family: dflash ----

  // ---- family: diffusion (csrc/kernels/diffusion, ops/diffusion_{cpu,cuda}.cpp) ----
  // diffusion_unmask: one step of masked-diffusion generation over a window of positions: a token
  // and its confidence per masked position (tokens == mask_id), then the positions to unmask (top
  // num_transfer by confidence, or confidence >= threshold plus the best one when threshold > 0).
  m.def(
      "diffusion_unmask(Tensor logits, Tensor tokens, int mask_id, Tensor temperature, "
      "Tensor top_k, Tensor top_p, Tensor seed, Tensor position, Tensor step, "
      "Tensor num_transfer, Tensor threshold, Tensor(a!) sampled, Tensor(b!) confidence, "
      "Tensor(c!) keep, Tensor(d!) status) -> ()");
  // ---- end family: diffusion ----

  // ---- family: ddtree (csrc/kernels/ddtree, ops/ddtree_{cpu,cuda}.cpp) ----
  // ddtree_build: the best draft tree of `budget` nodes from per-depth top-K log-probabilities
  // (best-first heap; reference/ddtree.py): BFS tokens, parents, depths, node counts, visibility.
  m.def(
      "ddtree_build(Tensor topk_logprobs, Tensor topk_tokens, Tensor max_depth, int budget, "
      "Tensor(a!) tokens, Tensor(b!) parents, Tensor(c!) depth, Tensor(d!) num_nodes, "
      "Tensor(e!) tree_mask, Tensor(f!) status) -> ()");
  // ---- end family: ddtree ----

  // ---- family: mtp (csrc/kernels/mtp, ops/mtp_{cpu,cuda}.cpp) ----
  // mtp_head_topk: per row of x, final RMSNorm + LM-head matmul + top-k (ties to the lower id)
  // without writing the [M, V] logits unless `logits` is given (reference/mtp.py).
  m.def(
      "mtp_head_topk(Tensor x, Tensor norm_weight, Tensor lm_head, float eps, Tensor(a!) values, "
      "Tensor(b!) indices, Tensor(c!)? logits, Tensor(d!) status) -> ()");
  // mtp_head_topk_w4: the same over a 4-bit LM head [vocab_size, H] in LAYOUT_CPU (quant family).
  // CPU only.
  m.def(
      "mtp_head_topk_w4(Tensor x, Tensor norm_weight, Tensor packed, Tensor scales, int group_size, "
      "int vocab_size, float eps, Tensor(a!) values, Tensor(b!) indices, Tensor(c!)? logits, "
      "Tensor(d!) status) -> ()");
  // mtp_head_topk_packed: the same over an LM head packed for the CPU decoding path
  // (skinny_linear_packed's panels [ceil(vocab_size/64), H, 64], float32 or bfloat16); `lse` [M]
  // float32, when given, each row's log-sum-exp over the vocabulary. CPU only.
  m.def(
      "mtp_head_topk_packed(Tensor x, Tensor norm_weight, Tensor panels, int vocab_size, float eps, "
      "Tensor(a!) values, Tensor(b!) indices, Tensor(c!)? logits, Tensor(d!) status, Tensor(e!)? lse=None) -> ()");
  // mtp_input: eh_proj[:, :H] . enorm(embed[tokens]) + eh_proj[:, H:] . hnorm(h), the DeepSeek-V3
  // MTP module's input, without building the [M, 2H] concatenation.
  m.def(
      "mtp_input(Tensor h, Tensor tokens, Tensor embed, Tensor enorm_weight, Tensor hnorm_weight, "
      "Tensor eh_proj, float eps, Tensor(a!) out, Tensor(b!) status) -> ()");
  // ---- end family: mtp ----

  // ---- family: gguf (csrc/kernels/gguf, ops/gguf_{cpu,cuda}.cpp) ----
  // GGUF (ggml) quantized weights read as stored in the file: `weight` is the uint8 bytes of the
  // blocks of W [N, K] (N rows of K / QK blocks), `type` the GGML type id (3 Q4_1, 6 Q5_0, 8 Q8_0,
  // 12 Q4_K, 14 Q6_K; layouts in kernels/gguf/blocks.h, reference/gguf.py).
  // gguf_matmul: out [M, N] = x [M, K] · dequant(W)ᵀ, accumulated in float32, each output's order
  // depending only on K (a row of x gets the same bits in any batch).
  m.def("gguf_matmul(Tensor x, Tensor weight, int type, Tensor(a!) out) -> ()");
  // gguf_dequantize: out [N, K] = dequant(W): float32, or bfloat16 (CPU, CUDA) / float16 (CUDA)
  // rounded once.
  m.def("gguf_dequantize(Tensor weight, int type, Tensor(a!) out) -> ()");
  // gguf_linear: out [M, N] = x [M, K] · Wᵀ (+ bias [N]) in float32, W the concatenation along N of
  // the GGUF weights `weights` (types: their type ids), e.g. a model's LM head or fused q|k|v; rows
  // claimed by threads, each output's order as gguf_matmul's. CPU only.
  // activations: 0 float32, 1 Q8 (rows quantised once to int8 blocks of 32, integer dot products;
  // gguf_matmul_q8's order).
  m.def("gguf_linear(Tensor x, Tensor[] weights, int[] types, Tensor? bias, int activations, Tensor(a!) out) -> ()");
  // _gguf_cpu_isa: code[0] = the CPU matmul tier running (0 portable, 1 AVX2, 2 AVX-512), for the
  // tests and benches (ops/gguf.py cpu_isa()). CPU only.
  m.def("_gguf_cpu_isa(Tensor(a!) code) -> ()");
  // gguf_matmul_q8: out [M, N] = x [M, K] · dequant(W)ᵀ with x quantised to int8 blocks of 32
  // first (kernels/gguf/q8.h: integer dot products, a float order depending only on K; lossy,
  // ~1e-2 of max|x|·|W|). CPU only.
  m.def("gguf_matmul_q8(Tensor x, Tensor weight, int type, Tensor(a!) out) -> ()");
  // gguf_quantize_q8: out [M, q8_row_bytes(K)] uint8 = the Q8 activation rows of x [M, K] float32
  // (the format of kernels/gguf/q8.h), for tests and callers that reuse them. CPU only.
  m.def("gguf_quantize_q8(Tensor x, Tensor(a!) out) -> ()");
  // _gguf_q8_cpu_isa: code[0] = the Q8 matmul's tier (0 portable, 1 AVX2, 2 AVX-512). CPU only.
  m.def("_gguf_q8_cpu_isa(Tensor(a!) code) -> ()");
  // gguf_repack_lanes: out = a Q4_K or Q6_K weight's blocks [N, K / 256 * block bytes] uint8 (`type`
  // 12 or 14) with each block's codes permuted into the VNNI kernel's lane order (type 268
  // Q4_K_LANES / 270 Q6_K_LANES, kernels/gguf/blocks.h): the same values and matmul bits, no
  // transpose per block at decoding. K given, as the weight's shape is bytes. CPU only.
  m.def("gguf_repack_lanes(Tensor weight, int type, int K, Tensor(a!) out) -> ()");
  // gguf_repack_panels: out = a weight's blocks [N, K / QK * block bytes] uint8 (`type` 3, 6, 8, 12
  // or 14, N a multiple of 16) in panels of 16 rows (type 512 + `type`: Q4_1_PANELS ... Q6_K_PANELS,
  // kernels/gguf/panels.h), the layout the VNNI lanes kernels read at every row count; `inverse`:
  // `type` is a panel layout and out its file order. The same bytes permuted (Q8_0's codes stored
  // as w + 128): values and bits unchanged. K given, as the weight's shape is bytes. CPU only.
  m.def("gguf_repack_panels(Tensor weight, int type, int K, bool inverse, Tensor(a!) out) -> ()");
  // ---- end family: gguf ----
}
