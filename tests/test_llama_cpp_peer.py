"""Opt-in: the llama.cpp peer runner (bench/peers/llama_cpp_peer.py) on SmolLM2-135M's GGUF (Q4_1).

Runs where the private environment is built (``make llama-cpp-env``) and the model is fetched
(``python -m specdec_cuda models fetch smollm2-135m``); skipped otherwise. Two short prompts, 8
new tokens, in three modes: the result has the runner's shape, and llama.cpp's prompt lookup and
its draft-model speculation (the model drafting for itself) emit plain greedy decoding's tokens,
as lossless speculation must under greedy decoding.
"""

from __future__ import annotations

import json

import pytest

from bench.peers import llama_cpp_rows as peer
from specdec_cuda import models

pytestmark = pytest.mark.slow

NAME = "smollm2-135m"
NEW_TOKENS = 8
TEXTS = ["def add(a, b):\n    return a + b\n\n\ndef add(a, b):\n",
         "The quick brown fox jumps over the lazy dog. The quick brown fox"]
MODES = ["plain", "prompt_lookup:10", "draft:3"]


@pytest.fixture(scope="module")
def folder():
    if not (peer.VENV / "bin" / "python").exists():
        pytest.skip(f"no {peer.VENV} (make llama-cpp-env)")
    try:
        folder = models.model_path(NAME, fetch_if_missing=False)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    if peer.gguf_of(folder) is None:
        pytest.skip(f"no model.gguf in {folder}")
    return folder


def test_peer_modes_agree_and_report_shape(folder):
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    prompts = [tok.encode(text, add_special_tokens=False).ids for text in TEXTS]
    eos = json.loads((folder / "generation_config.json").read_text())["eos_token_id"]
    gguf = peer.gguf_of(folder)
    job = dict(model=str(gguf), draft_model=str(gguf), prompts=prompts, max_new_tokens=NEW_TOKENS,
               eos_token_ids=[eos], n_threads=2, warmup_tokens=2, modes=MODES)
    result = peer.run_peer(job, timeout=120)

    assert result["peer"] == "llama.cpp" and result["n_threads"] == 2
    assert list(result["modes"]) == MODES
    for mode, summary in result["modes"].items():
        assert len(summary["prompts"]) == len(prompts), mode
        for row in summary["prompts"]:
            assert 1 <= len(row["new_tokens"]) <= NEW_TOKENS
            assert all(isinstance(t, int) for t in row["new_tokens"])
            assert row["seconds"] > 0 and row["tokens_per_s"] > 0
            assert 0 < row["prefill_seconds"] <= row["seconds"]
        assert summary["tokens"] == sum(len(r["new_tokens"]) for r in summary["prompts"])
    plain = [r["new_tokens"] for r in result["modes"]["plain"]["prompts"]]
    for mode in MODES[1:]:
        assert [r["new_tokens"] for r in result["modes"][mode]["prompts"]] == plain, mode
        assert result["modes"][mode]["tau"] >= 1.0, mode
    # A model drafting for itself is (up to batched rounding) always right: most steps keep every draft.
    assert result["modes"]["draft:3"]["tau"] > 2.0

    rows = peer.bench_rows(result, {"tiny": prompts}, {"tiny": dict(tokens_per_s=1.0, outputs=plain)})
    assert [r["method"] for r in rows] == ["llama.cpp plain", "llama.cpp prompt_lookup n=10", "llama.cpp draft k=3"]
    assert all(r["identical"] and r["agreement"] == dict(positions=1.0, prefix=1.0) for r in rows)
