"""Zoo v4: resumable training, bits per character, the held-out split (tiny, seconds)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from specdec_cuda import models
from zoo import pairs
from zoo import unlikelihood as zoo_unlikelihood
from zoo import v4 as zoo_v4
from zoo.train import main as zoo_main

TINY = pairs.V4Spec(
    name="tiny-v4", vocab_size=300, max_position=64, seq_len=16, batch_size=4, micro_batch=2,
    target=pairs.LMConfig(2, 32, 64, 2, 1), draft=pairs.LMConfig(1, 32, 64, 2, 1),
    target_steps=6, unlikelihood_steps=2, draft_steps=4, warmup_steps=2, eval_every=3, quick_eval_chars=400,
    checkpoint_seconds=0.0, log_every=1, prompts=2, prompt_new_tokens=8)


def _corpus() -> zoo_v4.Corpus:
    # Two files full of definitions: the unlikelihood phase's judge takes its openings from whichever
    # comes first in the token stream.
    train = [(f"t/{i}", Path(m.__file__).read_text()) for i, m in enumerate((zoo_v4, zoo_unlikelihood))]
    return zoo_v4.Corpus(train=train, heldout=[("h/zoo.py", Path(pairs.__file__).read_text()[:3000])])


def _weights(run_dir: Path) -> dict:
    state = torch.load(run_dir / zoo_v4.CHECKPOINT, weights_only=False)
    return {f"{m}.{k}": v for m in ("target", "draft") for k, v in state[m].items()}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = tmp_path_factory.mktemp("v4") / "run"
    lines = []
    report = zoo_v4.train_v4(run, TINY, corpus=_corpus(), log=lines.append)
    return run, report, lines


def test_resumed_run_matches_uninterrupted_run(uninterrupted, tmp_path):
    run, report, _ = uninterrupted
    # Stop in the middle of the target's training, at the start of the unlikelihood phase (which
    # then restarts from the target's weights), then in the middle of the draft's training.
    first = zoo_v4.train_v4(tmp_path, TINY, corpus=_corpus(), log=lambda _: None, stop_after=4)
    assert first == {"phase": "target", "step": 4, "pos": 16, "tokens": 4 * 4 * 16}
    between = zoo_v4.train_v4(tmp_path, TINY, log=lambda _: None, stop_after=TINY.target_steps)
    assert between["phase"] == "unlikelihood" and between["step"] == 0
    second = zoo_v4.train_v4(tmp_path, TINY, log=lambda _: None,
                             stop_after=TINY.target_steps + TINY.unlikelihood_steps + 2)
    assert second["phase"] == "draft" and second["step"] == 2
    final = zoo_v4.train_v4(tmp_path, TINY, log=lambda _: None)
    ours, theirs = _weights(tmp_path), _weights(run)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    assert final["target_heldout"] == report["target_heldout"]
    assert final["agreement"] == report["agreement"]
    # A finished run is not retrained.
    assert zoo_v4.train_v4(tmp_path, TINY, log=lambda _: None)["agreement"] == report["agreement"]


def test_run_reports_progress_and_exports_loadable_folders(uninterrupted, tmp_path):
    from transformers import AutoModelForCausalLM

    run, report, lines = uninterrupted
    assert any("tok/s" in line and "ETA" in line and "loss" in line for line in lines)
    assert (run / "train.log").read_text().count("ETA") >= TINY.target_steps + TINY.draft_steps
    assert [e["step"] for e in report["evals"]] == [3, 6]
    assert report["train_tokens_seen"] == (TINY.target_steps + TINY.draft_steps) * 4 * 16
    for key in ("bits_per_char", "nats_per_token", "chars_per_token"):
        assert report["target_heldout"][key] > 0
    assert 0 <= report["agreement"]["greedy"] <= 1
    quality = report["greedy_quality"]
    assert quality["prompts"] == 2 and 0 < quality["distinct_4_corpus"] <= 1
    # The unlikelihood phase ran between the target and the draft, judged before and after.
    assert any("unlikelihood step" in line for line in lines)
    assert [e["step"] for e in report["unlikelihood"]["evals"]] == [0, 1, 2]
    assert report["target_heldout_before_unlikelihood"]["chars"] == report["target_heldout"]["chars"]
    assert report["target_heldout_before_unlikelihood"] != report["target_heldout"]
    hf = AutoModelForCausalLM.from_pretrained(run / "export" / "target")
    assert hf.config.num_hidden_layers == 2
    assert json.loads((run / "export" / "report.json").read_text())["params"] == report["params"]


def test_run_folder_is_locked_while_a_run_trains(uninterrupted):
    import fcntl

    run, _, _ = uninterrupted
    with open(run / "lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RuntimeError, match="another process"):
            zoo_v4.train_v4(run, TINY, log=lambda _: None)


def test_run_folder_refuses_another_spec(uninterrupted):
    run, _, _ = uninterrupted
    other = pairs.V4Spec(**{**TINY.__dict__, "target_steps": 7})
    with pytest.raises(ValueError, match="target_steps"):
        zoo_v4.train_v4(run, other, log=lambda _: None)


class _Bigram(torch.nn.Module):
    """logits[t] depend on input token t only: the loss of a token does not depend on its window."""

    def __init__(self, vocab: int):
        super().__init__()
        self.table = torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0))

    def forward(self, input_ids):
        return type("Out", (), {"logits": self.table[input_ids]})()


class _CharTokenizer:
    """One token per character (ids = code points mod 50 + 1; 0 is EOS)."""

    def __call__(self, text):
        return {"input_ids": [ord(c) % 50 + 1 for c in text]}


def test_bits_per_char_on_toy_models():
    texts = ["def f(x):\n    return x + 1\n", "import os\n" * 7, "z"]
    tok = _CharTokenizer()
    chars = sum(map(len, texts))
    # Uniform over V: every token costs log2(V) bits; one token per character here.
    uniform = _Bigram(51)
    uniform.table.zero_()
    got = zoo_v4.bits_per_char(uniform, tok, texts, seq_len=5, eos_id=0)
    assert got["tokens"] == chars and got["chars"] == chars
    assert got["bits_per_char"] == pytest.approx(math.log2(51), rel=1e-6)
    # A bigram model: the exact sum of -log2 p(next | current), token by token, whatever the windows.
    model = _Bigram(51)
    expected = 0.0
    for text in texts:
        ids = [0] + tok(text)["input_ids"]
        for a, b in zip(ids, ids[1:]):
            expected -= torch.log_softmax(model.table[a], -1)[b].item() / math.log(2)
    for seq_len in (1, 4, 7, 1000):
        got = zoo_v4.bits_per_char(model, tok, texts, seq_len=seq_len, eos_id=0, batch=2)
        assert got["bits_per_char"] == pytest.approx(expected / chars, rel=1e-5), seq_len
    with pytest.raises(ValueError, match="non-empty"):
        zoo_v4.bits_per_char(model, tok, [""], seq_len=4, eos_id=0)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _module_text(tag: str) -> str:
    return "".join(f"def {tag}_function_number_{i}(argument_one, argument_two):\n    return {i}\n\n"
                   for i in range(12))


def test_heldout_split_is_disjoint_from_training(tmp_path):
    lib, site = tmp_path / "lib", tmp_path / "site"
    names = [f"mod{i}.py" for i in range(60)]
    held = [n for n in names if zoo_v4.is_heldout_module(n, TINY.heldout_modulo)]
    assert 0 < len(held) < len(names)
    for n in names:
        _write(lib / n, _module_text(n[:-3]))
    _write(lib / "pkg" / held[0], "# a subpackage file of the same name is not the held-out module\nx = 1\n")
    _write(lib / "site-packages" / "ignored.py", "y = 2\n")
    # A vendored exact copy and a lightly edited copy of a held-out module, and a plain duplicate.
    _write(site / "vendor" / "copy.py", _module_text(held[0][:-3]))
    _write(site / "vendor" / "edited.py", "# edited\n" + _module_text(held[-1][:-3]).replace("return 3", "return 4"))
    _write(site / "other" / "dup.py", _module_text("mod0" if "mod0.py" not in held else "mod1"))
    _write(site / "other" / "own.py", "def own():\n    return 'own'\n")
    corpus = zoo_v4.code_corpus(TINY, log=lambda _: None, stdlib=lib, site_dirs=[site])
    assert sorted(n for n, _ in corpus.heldout) == sorted(f"stdlib/{n}" for n in held)
    train_texts = {t for _, t in corpus.train}
    train_lines = {line for t in train_texts for line in t.splitlines() if len(line.strip()) >= 40}
    for _, text in corpus.heldout:
        assert text not in train_texts
        assert not (zoo_v4._long_lines(text) & train_lines)
    names_in = {n for n, _ in corpus.train}
    assert "other/own.py" in names_in and "stdlib/ignored.py" not in names_in
    assert f"stdlib/{held[0]}" in names_in  # the subpackage file, not the module
    assert corpus.stats["dropped_heldout_overlap"] >= 2 and corpus.stats["dropped_duplicates"] >= 1
    assert len(train_texts) == len(corpus.train)


def test_heldout_prompts_come_from_the_heldout_split():
    held = zoo_v4.stdlib_heldout()
    assert all(zoo_v4.is_heldout_module(n.split("/")[-1]) for n, _ in held)
    prompts = zoo_v4.heldout_prompts(6)
    assert len(prompts) == 6 and len(set(prompts)) == 6
    for p in prompts:
        last = p.splitlines()[-1].lstrip()
        assert last.startswith(("def ", "class ")) and last.endswith(":") and not p.endswith("\n")
        assert any(p in text for _, text in held)


def test_opening_cases_end_before_the_newline_and_prefixes_take_the_last_tokens():
    text = "import os\n# a header comment, long enough to count as context\n\ndef first(a, b):\n    return a + b\n" + \
        "# filler line of text\n" * 8 + \
        "class Second:\n    x = 1\n" + "# more filler text\n" * 8
    cases = zoo_v4.opening_cases([text], None, max_prompt_chars=200)
    assert [p.splitlines()[-1] for p, _ in cases] == ["def first(a, b):", "class Second:"]
    for prompt, continuation in cases:
        # The newline (merged with the next line's indentation by the BPE) starts the continuation.
        assert continuation.startswith("\n    ") and (prompt + continuation) in text
    assert zoo_v4.opening_cases([text], 1, max_prompt_chars=200) == cases[:1]
    with pytest.raises(ValueError, match="no def/class line"):
        zoo_v4.opening_cases(["x = 1\n"], None)

    class Chars:  # one token per character
        def __call__(self, texts):
            return {"input_ids": [[ord(c) for c in t] for t in texts]}

    prefixes = zoo_v4.opening_prefixes([text], Chars(), 10)
    assert prefixes.shape == (2, 10) and prefixes.dtype == torch.int64
    assert "".join(map(chr, prefixes[0].tolist())) == "rst(a, b):"
    with pytest.raises(ValueError, match="no code opening of 1000 tokens"):
        zoo_v4.opening_prefixes([text], Chars(), 1000)


def test_lr_schedule_and_repetition_metrics():
    lrs = [zoo_v4.lr_at(s, 100, 1.0, 10, 0.1) for s in range(101)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert lrs[100] == pytest.approx(0.1) and all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert zoo_v4.distinct_ngram_ratio([1, 2, 3, 4, 5, 6], 4) == 1.0
    assert zoo_v4.distinct_ngram_ratio([7] * 10, 4) == pytest.approx(1 / 7)
    assert zoo_v4.collapsed([1, 2, 3] + [5, 6] * 20) and zoo_v4.collapsed([9] * 30)
    assert not zoo_v4.collapsed(list(range(64)))
    with pytest.raises(ValueError, match="n=4"):
        zoo_v4.distinct_ngram_ratio([1, 2], 4)


def test_window_sampler_covers_each_epoch_once():
    data = torch.arange(1 + 16 * 10 + 16, dtype=torch.int16)
    sampler = zoo_v4.WindowSampler(data, 16, seed=3)
    starts = [int(row[0]) for row in sampler.batch(0, sampler.per_epoch)]
    assert len(set(starts)) == sampler.per_epoch and len({s % 16 for s in starts}) == 1
    assert torch.equal(sampler.batch(5, 3), torch.cat([sampler.batch(5, 1), sampler.batch(6, 2)]))


def test_v4_cli_and_get_pair_before_the_run_finishes(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_ZOO_DIR", str(tmp_path))
    monkeypatch.setattr(pairs, "shipped_root", lambda: None)  # neither shipped nor cached
    with pytest.raises(FileNotFoundError, match="--zoo v4"):
        pairs.get_pair(pairs.SPECS["v4"])
    assert zoo_main(["--zoo", "v4", "--force"]) == 2


def test_methods_trained_against_a_v4_target_never_see_its_heldout_split(tmp_path):
    # Heads, the DFlash drafter and the diffusion LM learn from pairs.training_texts(target folder):
    # the v4 held-out modules (the e2e bench's held-out workload) are left out for a v4 pair and
    # for a folder without a zoo report; a v3 pair (held-out text = the stream's tail) keeps all.
    everything = pairs.stdlib_corpus()
    held = {text for _, text in zoo_v4.stdlib_heldout()}
    v3, v4, bare = tmp_path / "v3", tmp_path / "v4", tmp_path / "bare"
    for folder, report in ((v3, {"spec": {"name": "pystdlib-v3"}}), (v4, {"spec": {"heldout_modulo": 10}}),
                           (bare, None)):
        (folder / "target").mkdir(parents=True)
        if report is not None:
            (folder / "report.json").write_text(json.dumps(report))
    assert pairs.pair_heldout_modulo(v3) is None and pairs.pair_heldout_modulo(v4) == 10
    assert pairs.training_texts(v3 / "target") == everything
    for folder in (v4, bare):
        texts = pairs.training_texts(folder / "target")
        assert held and not held & set(texts)
        assert set(texts) <= set(everything) and len(everything) - len(texts) >= len(held)


# A finished run from before the unlikelihood phase existed (the shipped v4 pair is one).
TINY_PLAIN = dataclasses.replace(TINY, unlikelihood_steps=0)


def test_refine_pair_fine_tunes_a_finished_pair(tmp_path):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "plain"
    report = zoo_v4.train_v4(run, TINY_PLAIN, corpus=_corpus(), log=lambda _: None)
    assert "unlikelihood" not in report
    lines = []
    refined = zoo_v4.refine_pair(run / "export", tmp_path, TINY, corpus=_corpus(), draft_steps=2,
                                 log=lines.append)
    assert refined["refined_from"]["target_heldout"] == report["target_heldout"]
    assert refined["refined_from"]["draft_steps"] == 2
    assert refined["target_heldout"] != report["target_heldout"]
    assert any("draft step" in line for line in lines) and (tmp_path / "train.log").is_file()
    old = AutoModelForCausalLM.from_pretrained(run / "export" / "draft")
    new = AutoModelForCausalLM.from_pretrained(tmp_path / "export" / "draft")
    assert any(not torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))
    assert json.loads((tmp_path / "export" / "report.json").read_text())["unlikelihood"] == refined["unlikelihood"]
    assert refined["unlikelihood"]["round"] == 1
    # A second round continues from the refined pair with prefixes of its own and keeps the chain.
    again = zoo_v4.refine_pair(tmp_path / "export", tmp_path / "again", TINY, corpus=_corpus(), draft_steps=2,
                               log=lines.append)
    assert again["unlikelihood"]["round"] == 2 and any("round 2" in line for line in lines)
    # Each round takes its entry of spec.unlikelihood_rounds (loop period, continuation, seed offset);
    # past the table, the last entry with the next seed.
    first, second = refined["unlikelihood"]["spec"], again["unlikelihood"]["spec"]
    assert (first["max_period"], first["seed"]) == (16, TINY.seed)
    assert (second["max_period"], second["seed"]) == (16, TINY.seed + 1)
    assert (first["continuation_len"], second["continuation_len"]) == (TINY.seq_len // 4,) * 2  # capped by seq_len
    assert again["refined_from"]["unlikelihood"] == refined["unlikelihood"]
    assert again["refined_from"]["refined_from"] == refined["refined_from"]
    assert again["refined_from"]["target_heldout"] == refined["target_heldout"] != again["target_heldout"]



def test_unlikelihood_rounds_past_the_table_repeat_its_last_entry_with_the_next_seeds():
    spec = dataclasses.replace(TINY, seq_len=512, unlikelihood_rounds=((16, 64, 0), (32, 80, 2)))
    assert [zoo_v4.unlikelihood_round(spec, r) for r in (1, 2, 3, 5)] == [
        (16, 64, spec.seed), (32, 80, spec.seed + 2), (32, 80, spec.seed + 3), (32, 80, spec.seed + 5)]
    assert zoo_v4.unlikelihood_round(TINY, 2) == (16, TINY.seq_len // 4, TINY.seed + 1)  # capped by seq_len
    with pytest.raises(ValueError, match="count from 1"):
        zoo_v4.unlikelihood_round(spec, 0)
