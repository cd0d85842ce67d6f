"""Issue 12: one test per class of hardening bug (bad and adversarial inputs).

* bounds checks that overflowed near INT64_MAX (run in a child process: before the fix they wrote
  outside the tensors);
* NaN / inf hidden by the 4-bit KV quantisation;
* state accepted with the wrong shape (QuantKVCache);
* dtypes silently converted (integer activations into the 4-bit matmul, float offsets);
* errors that named the wrong thing or nothing.
"""

from __future__ import annotations

import json

import pytest
import torch

import specdec_cuda.ops as ops
from specdec_cuda.models import QuantKVCache
from specdec_cuda.models.config import LlamaConfig
from specdec_cuda.models.loader import SafetensorsFolder, load
from specdec_cuda.ops import kv_quant as kvops
from specdec_cuda.ops.status import STATUS_BAD_COMPACTION
from specdec_cuda.quant import W4Linear, quantize_linears
from specdec_cuda.reference import kv_quant as kvref

from _isolated import run_isolated

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

I64_MAX = 2**63 - 1


# ---- bounds checks near the int64 limit (child process: a regression would crash) -------------

def test_overflowing_offsets_are_rejected_not_followed():
    records = run_isolated(f'''
    I64_MAX = {I64_MAX}
    from specdec_cuda.ops import kv_quant as kvops

    def kv_start(start, values):
        c = kvops.allocate_kv_cache(1, 2, 128, 16, key_group=64, value_group=8)
        before = {{k: v.clone() for k, v in c.items()}}
        x = torch.randn(1, 2, 64, 16)
        try:
            if values:
                kvops.kv_quantize_values(x, torch.tensor([start]), 8, c["v_upper"], c["v_lower"],
                                         c["v_scale"], c["v_zero"])
            else:
                kvops.kv_quantize_keys(x, torch.tensor([start]), 64, c["k_upper"], c["k_lower"],
                                       c["k_scale"], c["k_zero"])
        finally:
            assert all(torch.equal(before[k], c[k]) for k in c), "cache written"

    # start + T wraps to a negative number that passed `start + T <= capacity`
    case("kv_keys_start", lambda: kv_start(I64_MAX - 63, False))
    case("kv_values_start", lambda: kv_start(I64_MAX - 1, True))

    def compact(nodes, num_accepted, src, dst):
        k = torch.arange(2 * 8 * 4, dtype=torch.float32).reshape(2, 1, 8, 4)
        before = k.clone()
        status = ops.compact_kv([k], torch.tensor(nodes), torch.tensor(num_accepted),
                                torch.tensor(src), torch.tensor(dst), check=False)
        return {{"status": status.tolist(), "untouched": torch.equal(k, before)}}

    # src_start + node wraps negative; num_accepted + 1 wraps; a node near INT64_MAX
    case("compact_src", lambda: compact([[0, 5], [-1, -1]], [1, 0], [I64_MAX - 2, 0], [0, 0]))
    case("compact_num_accepted", lambda: compact([[0, 1], [-1, -1]], [I64_MAX, 0], [0, 0], [0, 0]))
    case("compact_node", lambda: compact([[0, I64_MAX], [-1, -1]], [1, 0], [2, 0], [1, 0]))

    def tree_cache_len():
        layout = ops.build_tree(torch.tensor([-1, 0]), torch.tensor([0, 2]),
                                torch.tensor([I64_MAX - 1]), 2, check=False)
        return {{"status": layout.status.tolist()}}

    case("tree_cache_len", tree_cache_len)

    def chain_cu(max_draft):
        out = ops.verify_chain(torch.tensor([1, 2]), torch.tensor([0, I64_MAX, 2]),
                               torch.randn(4, 10), max_draft=max_draft)
        return {{"status": out.status.tolist()}}

    case("chain_cu_given_max_draft", lambda: chain_cu(2))
    case("chain_cu_read_max_draft", lambda: chain_cu(None))
    ''')
    by = {r["case"]: r for r in records}
    for name in ("kv_keys_start", "kv_values_start"):
        assert by[name]["raised"] == "RuntimeError" and "start[0]" in by[name]["message"], by[name]
    for name in ("compact_src", "compact_num_accepted", "compact_node"):
        assert by[name]["result"] == {"status": [STATUS_BAD_COMPACTION, 0], "untouched": True}, by[name]
    assert by["tree_cache_len"]["result"] == {"status": [4]}
    # with max_draft given the op reads cu on the host (CPU) and names the entry
    assert by["chain_cu_given_max_draft"]["raised"] == "RuntimeError"
    assert "cu_num_draft[1]" in by["chain_cu_given_max_draft"]["message"]
    # without, the Python layer reads it to size the outputs and names it before allocating
    assert by["chain_cu_read_max_draft"]["raised"] == "ValueError"
    assert "cu_num_draft[1]" in by["chain_cu_read_max_draft"]["message"]


def test_tree_cache_len_errors_name_cache_len():
    parents, cu = torch.tensor([-1, 0, -1]), torch.tensor([0, 2, 3])
    with pytest.raises(ValueError, match=r"cache_len\[1\] = -3"):
        ops.build_tree(parents, cu, torch.tensor([4, -3]), 2)
    with pytest.raises(ValueError, match=r"cache_len\[0\] = 9.*max_prefix=5"):
        ops.build_tree(parents, cu, torch.tensor([9, 1]), 2, hf_mask_dtype=torch.float32, max_prefix=5)
    # max_prefix from max(cache_len): a negative entry is flagged, not an allocation of P + M < 0
    with pytest.raises(ValueError, match=r"cache_len\[0\] = -50"):
        ops.build_tree(parents, cu, torch.tensor([-50, -60]), 2, hf_mask_dtype=torch.float16)
    with pytest.raises(ValueError, match="max_prefix: must be >= 0"):
        ops.build_tree(parents, cu, torch.tensor([0, 0]), 2, hf_mask_dtype=torch.float16, max_prefix=-1)
    # a huge cache_len would size a huge mask: the error names it
    with pytest.raises(ValueError, match="max\\(cache_len\\)"):
        ops.build_tree(parents, cu, torch.tensor([2**62, 0]), 2, hf_mask_dtype=torch.float16)


def test_tree_offsets_out_of_range_are_flagged_rows():
    # cu entries outside [0, N] do not size max_nodes; their rows are flagged and named
    parents = torch.tensor([-1, 0, 0])
    with pytest.raises(ValueError, match="row 1 is not a valid tree"):
        ops.build_tree(parents, torch.tensor([0, 3, 2**62]), torch.tensor([0, 0]))
    layout = ops.build_tree(parents, torch.tensor([0, 3, -7]), torch.tensor([0, 0]), check=False)
    assert layout.status.tolist() == [0, 4] and layout.depth.shape == (2, 3)


def test_verify_chain_cu_layout_errors_name_it():
    t = torch.randn(4, 10)
    with pytest.raises(ValueError, match=r"cu_num_draft\[1\] = -1"):
        ops.verify_chain(torch.tensor([1, 2]), torch.tensor([0, -1, 2]), t)
    with pytest.raises(ValueError, match="never decrease"):
        ops.verify_chain(torch.tensor([1, 2]), torch.tensor([0, 2, 1]), t)
    with pytest.raises(ValueError, match="max_draft must be an int >= 0"):
        ops.verify_chain(torch.tensor([1, 2]), torch.tensor([0, 1, 2]), t, max_draft=-1)


# ---- NaN / inf survive the 4-bit KV cache -------------------------------------------------------

@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_quant_non_finite_reads_back_nan(bad, dtype):
    torch.manual_seed(0)
    b, h, t, d, kg, vg = 2, 2, 64, 16, 32, 8
    k = torch.randn(b, h, t, d).to(dtype)
    v = torch.randn(b, h, t, d).to(dtype)
    k[1, 0, 40, 3] = bad          # key group: tokens 32..63 of channel 3, row 1 head 0
    v[0, 1, 5, 9] = bad           # value group: channels 8..15 of token 5, row 0 head 1
    c = kvops.allocate_kv_cache(b, h, t, d, kg, vg)
    kvops.kv_quantize_keys(k, 0, kg, c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"])
    kvops.kv_quantize_values(v, 0, vg, c["v_upper"], c["v_lower"], c["v_scale"], c["v_zero"])
    for use_lower in (True, False):
        kk = kvops.kv_dequantize_keys(c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"], kg, t, use_lower)
        vv = kvops.kv_dequantize_values(c["v_upper"], c["v_lower"], c["v_scale"], c["v_zero"], vg, t, use_lower)
        assert torch.isnan(kk[1, 0, 32:64, 3]).all() and torch.isnan(vv[0, 1, 5, 8:16]).all()
        assert torch.isnan(kk).sum() == 32 and torch.isnan(vv).sum() == 8  # nothing else
    # and exactly the reference's codes, scales and zeros (NaN where the reference has NaN)
    ku, kl, ks, kz = kvref.quantize_keys(k, kg)
    vu, vl, vs, vz = kvref.quantize_values(v, vg)
    assert torch.equal(c["k_upper"], ku) and torch.equal(c["k_lower"], kl)
    assert torch.equal(c["v_upper"], vu) and torch.equal(c["v_lower"], vl)
    for got, want in ((c["k_scale"], ks), (c["k_zero"], kz), (c["v_scale"], vs), (c["v_zero"], vz)):
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_kv_quant_range_overflow_and_subnormal_scale():
    # max - min = inf in float32: the group is flagged NaN rather than cast NaN codes to integers
    k = torch.zeros(1, 1, 32, 2)
    k[0, 0, 0, 0], k[0, 0, 1, 0] = 3e38, -3e38
    k[0, 0, 0, 1] = 4.2e-44  # a subnormal range (30 units): scale / 16 underflows to 0
    c = kvops.allocate_kv_cache(1, 1, 32, 2, 32, 2)
    kvops.kv_quantize_keys(k, 0, 32, c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"])
    out = kvops.kv_dequantize_keys(c["k_upper"], c["k_lower"], c["k_scale"], c["k_zero"], 32, 32)
    assert torch.isnan(out[0, 0, :, 0]).all() and torch.isfinite(out[0, 0, :, 1]).all()
    ku, kl, ks, _ = kvref.quantize_keys(k, 32)
    assert torch.equal(c["k_upper"], ku) and torch.equal(c["k_lower"], kl)
    torch.testing.assert_close(c["k_scale"], ks, rtol=0, atol=0, equal_nan=True)


def test_quant_cache_keeps_nan_visible():
    cache = QuantKVCache(1, 1, 1, 64, 8, key_group=16, value_group=8, residual=4)
    k, v = torch.randn(1, 1, 24, 8), torch.randn(1, 1, 24, 8)
    k[0, 0, 3, 2] = float("nan")
    cache.begin_forward(24)
    cache.write(0, k, v)                            # completes group 0..15: into the 4-bit codes
    q = cache.quantized[0]
    kq = kvops.kv_dequantize_keys(q["k_upper"], q["k_lower"], q["k_scale"], q["k_zero"], 16, 16)
    assert torch.isnan(kq[0, 0, :, 2]).all() and torch.isfinite(kq[0, 0, :, [0, 1, 3]]).all()
    cache.k_buffer[0][0, 0, 3, 2] = 0.0             # only the codes carry the NaN now
    quant_len = cache.quant_len(torch.arange(24)[None])
    assert quant_len[0, 19] == 0 and quant_len[0, 20] == 16  # positions >= 20 read 0..15 from the codes
    out = cache.attend(0, torch.randn(1, 1, 24, 8), quant_len, None, True)
    assert torch.isnan(out[0, 0, 20:]).all() and torch.isfinite(out[0, 0, :20]).all()


# ---- stateful methods check their arguments against the cache ------------------------------------

def test_quant_cache_rejects_wrong_state():
    with pytest.raises(ValueError, match="key_group must be an int >= 1"):
        QuantKVCache(1, 2, 1, 64, 8, key_group=0)
    with pytest.raises(ValueError, match="num_kv_heads must be an int >= 1"):
        QuantKVCache(1, 2, 0, 64, 8)
    with pytest.raises(ValueError, match="value_group \\(3\\) must be even and divide head_dim"):
        QuantKVCache(1, 2, 1, 64, 8, value_group=3)
    cache = QuantKVCache(2, 2, 1, 64, 8, key_group=16, value_group=8, residual=4)
    cache.begin_forward(5)
    for layer in range(2):
        cache.write(layer, torch.randn(2, 1, 5, 8), torch.randn(2, 1, 5, 8))
    cache.commit(torch.tensor([5, 5]))
    with pytest.raises(ValueError, match="lengths must have shape \\[2\\], got \\(3,\\)"):
        cache.truncate(torch.tensor([4, 4, 4]))
    with pytest.raises(ValueError, match="lengths must have shape \\[2\\], got \\(1,\\)"):
        cache.truncate([4])
    with pytest.raises(TypeError, match="integers"):
        cache.truncate(torch.tensor([4.7, 3.2]))
    with pytest.raises(ValueError, match="shape \\[2\\]"):
        cache.truncate(torch.tensor([[4, 4]]))
    with pytest.raises(ValueError, match="must lie in \\[0, current lengths"):
        cache.truncate([6, 0])
    with pytest.raises(ValueError, match="num_kept must have shape \\[2\\]"):
        cache.commit(torch.tensor([1, 1, 1]))
    with pytest.raises(TypeError, match="num_kept must hold integers"):
        cache.commit(torch.tensor([0.5, 1.0]))
    assert cache.lengths.tolist() == [5, 5]  # nothing above changed the state
    cache.truncate(torch.tensor([3, 5]))
    assert cache.lengths.tolist() == [3, 5]


# ---- dtypes are not silently converted -----------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.uint8])
def test_w4a16_rejects_integer_activations(dtype):
    lin = torch.nn.Linear(64, 32)
    q = W4Linear.from_linear(lin, group_size=32)
    x = torch.ones(3, 64, dtype=dtype)
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16"):
        q(x)
    with pytest.raises(TypeError, match="x must be float32"):
        ops.w4a16_matmul(x, q.weight_packed)
    # the op itself (for engines calling torch.ops directly) raises too
    out = torch.empty(3, 32, dtype=dtype)
    with pytest.raises(RuntimeError, match="x must be float32, float16 or bfloat16"):
        torch.ops.specdec.w4a16_matmul(x, q.packed, q.scales, 32, 0, out)


def test_float_offsets_are_not_truncated():
    c = kvops.allocate_kv_cache(1, 1, 64, 8, 32, 8)
    with pytest.raises(TypeError, match="start must be an int or an integer tensor"):
        kvops.kv_quantize_keys(torch.randn(1, 1, 32, 8), torch.tensor([31.9]), 32, c["k_upper"],
                               c["k_lower"], c["k_scale"], c["k_zero"])
    with pytest.raises(TypeError, match="cache_len: expected integers"):
        ops.build_tree(torch.tensor([-1]), torch.tensor([0, 1]), torch.tensor([2.5]))
    with pytest.raises(TypeError, match="position: expected integers"):
        ops.verify_tree(torch.tensor([0]), torch.tensor([-1]), torch.tensor([0, 1]),
                        torch.randn(1, 5), position=torch.tensor([1.5]))
    with pytest.raises(TypeError, match="max_nodes: expected an int"):
        ops.build_tree(torch.tensor([-1]), torch.tensor([0, 1]), torch.tensor([2]), 2.0)


# ---- errors name the argument or file ------------------------------------------------------------

def test_degenerate_configs_name_their_argument(tmp_path):
    with pytest.raises(ValueError, match="group_size must be -1 .* got 0"):
        quantize_linears(torch.nn.Sequential(torch.nn.Linear(64, 64)), include=["*"], group_size=0)
    with pytest.raises(ValueError, match="group_size"):
        ops.quantize_w4(torch.randn(32, 64), group_size=0)
    with pytest.raises(ValueError, match="num_attention_heads must be a positive integer"):
        LlamaConfig.from_hf_dict({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
                                  "intermediate_size": 16, "num_hidden_layers": 1,
                                  "num_attention_heads": 0})
    with pytest.raises(ValueError, match="num_key_value_heads must be a positive integer"):
        LlamaConfig.from_hf_dict({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
                                  "intermediate_size": 16, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "num_key_value_heads": 0})
    with pytest.raises(ValueError, match="vocab_size is missing"):
        LlamaConfig.from_hf_dict({"model_type": "llama", "hidden_size": 8, "intermediate_size": 16,
                                  "num_hidden_layers": 1, "num_attention_heads": 2})
    with pytest.raises(RuntimeError, match="group_size must be even"):
        kvops.kv_quantize_values(torch.randn(1, 1, 4, 8), 0, 0, *[torch.zeros(1)] * 4)


def test_corrupt_checkpoint_files_are_named(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ValueError, match="model.safetensors.index.json: not valid JSON"):
        SafetensorsFolder(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": [1, 2]}))
    with pytest.raises(ValueError, match="weight_map"):
        SafetensorsFolder(tmp_path)
    (tmp_path / "model.safetensors.index.json").unlink()
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00garbage!")
    with pytest.raises(ValueError, match="model.safetensors: not a readable safetensors file"):
        SafetensorsFolder(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json: expected a JSON object"):
        load(tmp_path)


def test_non_tensor_arguments_are_named():
    with pytest.raises(TypeError, match="target_logits: expected a tensor"):
        ops.verify_tree(torch.tensor([0]), torch.tensor([-1]), torch.tensor([0, 1]), [[0.0, 1.0]])
    with pytest.raises(TypeError, match="parents: expected an int64 or int32 tensor"):
        ops.build_tree("0,1", torch.tensor([0, 1]), torch.tensor([0]))
    with pytest.raises(TypeError, match="caches: expected a list"):
        ops.compact_kv(torch.zeros(1, 1, 4, 2), torch.tensor([[0]]), torch.tensor([0]), torch.tensor([0]))
    with pytest.raises(TypeError, match="x must be a tensor"):
        ops.w4a16_matmul([1.0] * 64, ops.quantize_w4(torch.randn(32, 64), 32))
    with pytest.raises(TypeError, match="k must be a tensor"):
        kvops.kv_quantize_keys(None, 0, 32, *[torch.zeros(1)] * 4)
    with pytest.raises(TypeError, match="logits must be a tensor"):
        ops.sample([[1.0, 2.0]])


def test_model_caches_reject_float_lengths(tmp_path):
    # the built-in model's static cache and the transformers adapter share the protocol's checks
    from decoding_models import load_backend, make_checkpoint
    folder = make_checkpoint(tmp_path / "m", seed=0)
    for backend in ("builtin", "hf"):
        cache = load_backend(folder, backend).new_cache(2, 16)
        with pytest.raises(TypeError, match="lengths must hold integers"):
            cache.truncate(torch.tensor([0.0, 0.0]))
        with pytest.raises(ValueError, match="lengths must have shape \\[2\\]"):
            cache.truncate(torch.tensor([0, 0, 0]))
        with pytest.raises(TypeError, match="num_kept must hold integers"):
            cache.commit(torch.tensor([0.5, 0.5]))
