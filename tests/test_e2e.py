"""The end-to-end bench (registry-driven, run end to end on a tiny random pair saved as HF folders)
and its held-out workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bench import e2e
from bench.configs import CONFIGS
from specdec_cuda import methods
from zoo import pairs
from specdec_cuda.__main__ import main

TINY = pairs.ZooSpec(name="tiny-random", vocab_size=300, max_position=1024, seq_len=32, batch_size=4,
                   target=pairs.LMConfig(2, 32, 64, 2, 1), draft=pairs.LMConfig(1, 32, 64, 2, 1))


def save_random_pair(folder: Path, report: dict | None = None) -> Path:
    """A randomly initialised target / draft (tokenizer trained on a little source) saved as the
    zoo saves a pair: ``folder/{target,draft}`` HF folders and ``report.json``."""
    tokenizer = pairs.train_tokenizer([Path(pairs.__file__).read_text()], TINY.vocab_size)
    eos = tokenizer.convert_tokens_to_ids(pairs.EOS)
    torch.manual_seed(0)
    target = pairs._llama(TINY.target, TINY, eos)
    draft = pairs._llama(TINY.draft, TINY, eos)
    pairs.init_draft_from_target(draft, target)  # a draft that agrees with the target now and then
    pairs.save_pair(folder, target, draft, tokenizer, eos, report or {})
    return folder


@pytest.fixture(scope="module")
def random_pair(tmp_path_factory):
    return save_random_pair(tmp_path_factory.mktemp("e2e") / "tiny-random")


def test_the_bench_lists_configurations_for_every_registered_method():
    missing = [m.name for m in methods.available() if m.name not in CONFIGS]
    assert not missing, f"registered methods the end-to-end bench cannot run (not in bench/configs.py): {missing}"


def _bench(folder: Path, out: Path, *extra: str) -> dict:
    rc = main(["bench", "--target", str(folder / "target"), "--draft", str(folder / "draft"),
               "--prompts", "2", "--batch", "2", "--max-new-tokens", "10", "--repeats", "1",
               "--out", str(out), *extra])
    assert rc == 0
    return json.loads(out.read_text())


def test_bench_runs_every_method_against_transformers(random_pair, tmp_path, capsys, monkeypatch):
    # One method registered without configurations: reported, not run.
    methods._load_builtin()
    monkeypatch.setitem(methods._REGISTRY, "unbenched", methods.MethodSpec(
        name="unbenched", summary="test only", lossless=True, make=lambda target: None))
    result = _bench(random_pair, tmp_path / "e2e.json")
    printed = capsys.readouterr().out
    assert "not benched: unbenched: bench/configs.py lists no configurations for it" in printed
    assert "unbenched" in result["not_benched"]

    rows = result["rows"]
    settings = {(r["workload"], r["batch"], r["temperature"]) for r in rows}
    assert settings == {(w, b, t) for w in ("bench prompts", "held-out") for b in (1, 2) for t in (0.0, 0.8)}
    pair = e2e.load_pair(random_pair / "target", random_pair / "draft")
    expected = []
    for spec in methods.available():
        if spec.name in result["not_benched"]:
            continue
        expected += [f"engine {spec.name}" + (f" ({label})" if label else "") for label, _ in CONFIGS[spec.name](pair)]
    assert {"engine autoregressive", "engine draft (k=4)", "engine prompt_lookup (chain k=4)"} <= set(expected)
    for setting in settings:
        names = {r["method"] for r in rows if (r["workload"], r["batch"], r["temperature"]) == setting}
        hf = {"transformers generate"}
        if setting[1] == 1:  # transformers runs assisted generation at batch 1 only
            hf |= {"transformers generate + assistant_model", "transformers generate + prompt_lookup_num_tokens=10"}
        assert names == set(expected) | hf, setting
    for r in rows:
        assert r["tokens"] > 0 and r["tokens_per_s"] > 0
        if r["temperature"] == 0.0 and r["system"] == "engine" and r["lossless"]:
            assert r["identical"] is True, r["method"]
        if r["temperature"] > 0:
            assert r["identical"] is None
    assert result["not_identical"] == []
    head = result["headline"]
    assert head["workload"] == "held-out" and head["batch"] == 1 and head["temperature"] == 0.0
    assert head["engine"].startswith("engine ") and head["transformers"].startswith("transformers ")
    by = {(r["workload"], r["batch"], r["temperature"], r["method"]): r["tokens_per_s"] for r in rows}
    assert head["ratio"] == pytest.approx(by["held-out", 1, 0.0, head["engine"]] / by["held-out", 1, 0.0, head["transformers"]])
    assert head["met"] == (head["ratio"] >= 1.5)
    assert "headline (held-out, batch 1, greedy)" in printed and "greedy" in printed


def test_best_ratios_skip_lossy_and_non_identical_rows():
    def row(method, system, tps, lossless=True, identical=True):
        return dict(workload="held-out", batch=1, temperature=0.0, method=method, system=system,
                    lossless=lossless, identical=identical, tokens_per_s=tps)
    rows = [row("engine autoregressive", "engine", 100), row("engine fast but wrong", "engine", 900, identical=False),
            row("engine diffusion", "engine", 800, lossless=False, identical=False),
            row("engine draft", "engine", 300), row("transformers generate", "transformers", 50),
            row("transformers generate + assistant_model", "transformers", 150)]
    (best,) = e2e.best_ratios(rows)
    assert best["engine"] == "engine draft" and best["transformers"] == "transformers generate + assistant_model"
    assert best["ratio"] == pytest.approx(2.0)


def test_held_out_workload_follows_the_pair(random_pair, tmp_path):
    from zoo import v4 as zoo_v4

    # Folders without a v3 report: the zoo v4 split (held-out stdlib modules).
    prompts, source = e2e.held_out_workload(3, random_pair)
    assert prompts == zoo_v4.heldout_prompts(3) and "v4" in source
    # A v3 pair: def openings from exactly its held-out tokens (the stream's last eval_tokens).
    v3 = save_random_pair(tmp_path / "v3", report={"spec": {"eval_tokens": 3000}})
    prompts, source = e2e.held_out_workload(2, v3)
    assert "v3" in source and all(p.lstrip().startswith("def ") for p in prompts)
    tok = e2e.load_pair(v3 / "target", v3 / "draft").tokenizer
    last = tok(pairs.stdlib_corpus()[-1])["input_ids"]  # the stream ends with the last file and EOS
    assert len(last) + 1 >= 3000
    held = tok.decode(last[-2999:])  # its last 3000 tokens: 2999 of the file, then EOS
    assert e2e._v3_heldout_text(tok, 3000) == held
    assert all(p in held for p in prompts)
    with pytest.raises(ValueError, match="function openings"):
        e2e.held_out_workload(10_000, v3)
