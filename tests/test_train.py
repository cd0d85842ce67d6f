"""``specdec_cuda.train``: prompts, the self-distillation cache, the resumable loop, the trainers,
and the drafter cache (``specdec_cuda.drafters``) that methods find their drafters in.

Tiny random targets (tests/decoding_models.py) and token-id prompts keep it fast; the CLI test
uses the zoo's tokenizer (shipped in the repository) on a tiny target of its vocabulary.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F_

import specdec_cuda
from decoding_models import make_checkpoint
from specdec_cuda import drafters, models
from specdec_cuda import train as T
from specdec_cuda.train import features as F
from specdec_cuda.train import texts

ZOO_TOKENIZER = Path(__file__).resolve().parents[1] / "zoo" / "pycode-v4" / "target"
DISTILL = F.DistillSpec(gen_tokens=16, batch_size=16)
LOOP = T.LoopSpec(steps=40, batch_size=8)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_DRAFTERS_DIR", str(tmp_path / "drafters"))
    monkeypatch.delenv("SPECDEC_DRAFTERS_PATH", raising=False)


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("train") / "target", layers=4, seed=0)


def _trained_on(target) -> F.FeatureSet:
    """The largest features set cached for ``target``: the training sequences (the held-out set is
    a sixteenth of them)."""
    folder = drafters.write_root() / drafters.fingerprint(target) / "features"
    return max((F.load_features(f) for f in folder.iterdir()), key=len)


def _prompts(n=40, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(64) for _ in range(rng.randrange(2, 10))] for _ in range(n)]


# -- prompts ----------------------------------------------------------------------------------------


def test_prompt_files(tmp_path):
    (tmp_path / "p.jsonl").write_text('"a"\n{"prompt": "b"}\n\n{"messages": [{"role": "user", "content": "c"}]}\n')
    got = texts.read_prompts(tmp_path / "p.jsonl")
    assert [p.text for p in got[:2]] == ["a", "b"] and got[2].messages[0]["content"] == "c"
    (tmp_path / "p.json").write_text('[{"text": "x"}, "y"]')
    assert [p.text for p in texts.read_prompts(tmp_path / "p.json")] == ["x", "y"]
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert [p.text for p in texts.read_prompts(tmp_path / "p.txt")] == ["one", "two"]
    (tmp_path / "bad.jsonl").write_text('{"nothing": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        texts.read_prompts(tmp_path / "bad.jsonl")
    with pytest.raises(FileNotFoundError):
        texts.read_prompts(tmp_path / "missing.txt")


def test_chat_template_and_windows():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ZOO_TOKENIZER)
    plain = texts.encode_prompts(tok, [texts.Prompt(text="def f(x):")], chat="auto")
    assert plain == [tok("def f(x):")["input_ids"]]  # no template: the text as is
    with pytest.raises(ValueError, match="no chat template"):
        texts.encode_prompts(tok, [texts.Prompt(text="x")], chat="on")
    tok.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    chat = texts.encode_prompts(tok, [texts.Prompt(text="def f(x):")], chat="auto")
    assert tok.decode(chat[0]) == "<user>def f(x):<assistant>"
    source = "".join(f"line {i} = {i * 7}\n" for i in range(200))
    cut = texts.prompts_from_texts(tok, [source], count=12, prompt_tokens=10, seed=1)
    assert len(cut) == 12 and all(len(p) == 10 for p in cut)
    for p in cut:  # each ends where a line starts
        assert tok.decode(p).endswith("\n")


def test_held_out_split_is_fixed_and_disjoint():
    prompts = [[i] for i in range(100)]
    train, held = texts.split_held_out(prompts)
    assert len(held) >= texts.MIN_HELD_OUT and not set(map(tuple, train)) & set(map(tuple, held))
    assert texts.split_held_out(prompts) == (train, held)
    with pytest.raises(ValueError):
        texts.split_held_out([[1]])


# -- the features cache -----------------------------------------------------------------------------


def test_features_are_the_targets_continuations_and_states_and_resume(tmp_path, target_dir):
    target = models.load(target_dir)
    prompts = _prompts(F.SHARD + 5)
    layers = (-1, 1)
    fs = F.build_features(target, prompts, tmp_path / "f", DISTILL, layers, log=lambda s: None)
    assert len(fs) == len(prompts) and sorted(fs.hidden) == [-1, 1]
    greedy = specdec_cuda.generate(target, prompts[:3], max_new_tokens=DISTILL.gen_tokens).tokens
    for i in range(3):
        seq = fs.tokens[fs.offsets[i]:fs.offsets[i + 1]].tolist()
        assert seq == prompts[i] + greedy[i] and int(fs.prompt_lens[i]) == len(prompts[i])
    tokens, generated, hidden = fs.batch([0, 2], layers)
    assert generated[0].tolist() == [False] * len(prompts[0]) + [True] * DISTILL.gen_tokens + \
        [False] * (tokens.shape[1] - len(prompts[0]) - DISTILL.gen_tokens)
    # The states are the target's over the sequence (float16 on disk).
    seq = tokens[:1, : len(prompts[0]) + DISTILL.gen_tokens]
    out = target.forward(seq, torch.arange(seq.shape[1])[None], target.new_cache(1, seq.shape[1]), hidden_layers=layers)
    torch.testing.assert_close(hidden[1][0, : seq.shape[1]], out.hidden_states[1][0].float(), atol=2e-2, rtol=1e-2)
    # An interrupted build resumes at the missing shard and gives the same data.
    (tmp_path / "f" / "shard-00001.safetensors").unlink()
    lines = []
    again = F.build_features(target, prompts, tmp_path / "f", DISTILL, layers, log=lines.append)
    assert "1 of 2 shards already" in lines[0] and torch.equal(again.tokens, fs.tokens)
    with pytest.raises(ValueError, match="other data"):
        F.build_features(target, prompts, tmp_path / "f", F.DistillSpec(gen_tokens=8), layers, log=lambda s: None)


# -- the loop ---------------------------------------------------------------------------------------


def test_an_interrupted_run_resumes_exactly(tmp_path):
    from specdec_cuda.train.loop import optimise

    data = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    spec = T.LoopSpec(steps=30, batch_size=4, checkpoint_seconds=0.0)

    def run(folder, stop_at=None):
        torch.manual_seed(0)
        module = torch.nn.Linear(8, 1)

        def loss(rows, step):
            if step == stop_at:
                raise KeyboardInterrupt
            return module(data[rows]).square().mean()

        try:
            optimise(module, loss, len(data), spec, folder / "ckpt.pt", log=lambda s: None)
        except KeyboardInterrupt:
            return None
        return module

    whole = run(tmp_path / "a")
    assert run(tmp_path / "b", stop_at=17) is None
    resumed = run(tmp_path / "b")
    for p, q in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


# -- the trainers, the cache and the methods --------------------------------------------------------


@pytest.mark.parametrize("kind,method", [("medusa", "medusa"), ("mtp", "mtp"), ("dflash", "dflash"),
                                         ("dflash", "ddtree"), ("eagle3", "eagle3")])
def test_trained_drafters_are_found_by_their_methods(tmp_path, target_dir, kind, method):
    prompts = _prompts()
    result = T.train(kind, target_dir, prompts=prompts, distill=DISTILL, loop=LOOP,
                     drafter=T.DrafterSpec(dflash_block_size=4), log=lambda s: None)
    target = models.load(target_dir)
    assert result.folder == drafters.drafter_dir(target, kind) and drafters.find(target, kind) == result.folder
    report = json.loads((result.folder / "report.json").read_text())
    assert report["target_fingerprint"] == drafters.fingerprint(target)
    assert len(report["held_out"]["positions"]) >= 2 and report["held_out"]["scored_positions"] > 0
    ar = specdec_cuda.generate(target, prompts[:4], max_new_tokens=12).tokens
    out = specdec_cuda.generate(target, prompts[:4], method=method, max_new_tokens=12, policy="fixed")
    assert out.tokens == ar and sum(out.metrics.drafted) > 0


@pytest.mark.parametrize("kind", ["medusa", "mtp", "dflash", "eagle3"])
def test_every_kind_trains_under_autocast_on_a_bfloat16_target(tmp_path, kind):
    # The real-model recipe (bench/train_real_drafters.sh): a bfloat16 target, bfloat16 autocast.
    target_dir = make_checkpoint(tmp_path / "target", layers=4, seed=1)
    result = T.train(kind, target_dir, prompts=_prompts(24), distill=DISTILL, dtype=torch.bfloat16,
                     loop=T.LoopSpec(steps=6, batch_size=4, autocast=True),
                     drafter=T.DrafterSpec(dflash_block_size=4), log=lambda s: None)
    report = json.loads((result.folder / "report.json").read_text())
    assert report["held_out"]["scored_positions"] > 0
    assert all(0.0 <= p["top1"] <= 1.0 for p in report["held_out"]["positions"])


def test_training_fits_the_targets_continuations(target_dir):
    # A random tiny target's continuations barely generalise from 150 prompts (the zoo target's do:
    # docs/training.md), so the check is on the sequences trained on: trained heads must guess the
    # target's tokens there better than the untrained ones (zero init: the LM head's own guess).
    from specdec_cuda.models.heads import MedusaHeads, load_heads, target_head
    from specdec_cuda.train.heads import medusa_report

    prompts = _prompts(160, seed=3)
    result = T.train("medusa", target_dir, prompts=prompts, distill=DISTILL,
                     loop=T.LoopSpec(steps=200, batch_size=16, lr=1e-2), log=lambda s: None)
    target = models.load(target_dir)
    trained_on = _trained_on(target)
    head = target_head(target)
    trained = medusa_report(load_heads(result.folder), head, trained_on)["positions"]
    untrained = medusa_report(MedusaHeads(32, 4), head, trained_on)["positions"]
    assert all(t["top1"] > u["top1"] + 0.03 for t, u in zip(trained, untrained))


def _teacher_forced(kind, target_dir, steps, drafter):
    """Train ``kind`` on 96 random 24-token prompts the target only reads (gen_tokens 0; 88 trained
    on, the rest held out). Returns the prompts, the result, the target, the training features and
    the log lines."""
    prompts = [[random.Random(i).randrange(64) for _ in range(24)] for i in range(96)]
    lines = []
    result = T.train(kind, target_dir, prompts=prompts, distill=F.DistillSpec(gen_tokens=0, batch_size=16),
                     loop=T.LoopSpec(steps=steps, batch_size=16, lr=3e-3), drafter=drafter, log=lines.append)
    assert any("the target reads 88 prompts" in line for line in lines)
    target = models.load(target_dir)
    return prompts, result, target, _trained_on(target), lines


def test_an_exit_adapter_learns_the_targets_next_tokens_from_the_prompts_it_reads(target_dir):
    # Teacher forcing (gen_tokens 0 by default from the CLI; here given): the sequences are the
    # prompts themselves, the labels the target's own distributions. Fit on the sequences trained
    # on (a random tiny target): the trained adapter agrees with the target's argmax more often than
    # the untrained one (the plain early exit), and layer_skip finds it and decodes exactly.
    from specdec_cuda.models.exit_adapter import ExitAdapter, ExitAdapterConfig
    from specdec_cuda.train.exit_adapter import exit_report
    from specdec_cuda.train.teacher import Teacher

    prompts, result, target, features, _ = _teacher_forced(
        "exit", target_dir, 150, T.DrafterSpec(exit_layer=1, exit_intermediate=32))
    assert features.generated_tokens() == 0 and sorted(features.hidden) == [-1, 0]
    trained = ExitAdapter.load(result.folder)
    teacher = Teacher(target, trained.draft_ids)
    untrained = ExitAdapter.initial(ExitAdapterConfig(**{k: v for k, v in vars(trained.config).items()}))
    assert exit_report(trained, teacher, features)["positions"][0]["top1"] > \
        exit_report(untrained, teacher, features)["positions"][0]["top1"] + 0.05
    ar = specdec_cuda.generate(target, prompts[:4], max_new_tokens=12).tokens
    out = specdec_cuda.generate(target, prompts[:4], method="layer_skip", adapter=True, max_new_tokens=12,
                                policy="fixed")
    assert out.tokens == ar and sum(out.metrics.drafted) > 0


def test_eagle3_starts_with_the_targets_final_norm_and_head_rows(target_dir):
    # Before training, the drafter's logits are the target's final norm and LM head over its
    # draft vocabulary (every other id here): the output space is the target's from the first step.
    from specdec_cuda.models.eagle3 import Eagle3Config, Eagle3Drafter
    from specdec_cuda.models.layers import rms_norm
    from specdec_cuda.train.eagle3 import head_from_target
    from specdec_cuda.train.teacher import Teacher

    target = models.load(target_dir)
    config = Eagle3Config.for_target(target, draft_vocab_size=32, intermediate_size=16)
    ids = torch.arange(0, 64, 2)
    drafter = Eagle3Drafter.random(config, d2t=ids - torch.arange(32), t2d=torch.isin(torch.arange(64), ids))
    drafter = drafter.attach(target).float()
    teacher = Teacher(target, drafter.target_ids())
    head_from_target(drafter, teacher)
    h = torch.randn(5, config.hidden_size, generator=torch.Generator().manual_seed(0))
    want = F_.linear(rms_norm(h, teacher.norm_weight, teacher.eps), teacher.full[ids])
    torch.testing.assert_close(drafter.logits(h), want, atol=1e-5, rtol=1e-5)


def test_eagle3_learns_the_targets_next_tokens_from_text_it_reads(target_dir):
    # Teacher forcing for EAGLE-3: the sequences are the prompts, the labels the target's own
    # distributions at every position (its final state), only EAGLE-3's layers are cached. Fit on
    # the sequences trained on (a random tiny target): training beats the untrained drafter at step
    # 0, and method="eagle3" finds the drafter and decodes exactly.
    from specdec_cuda.models.eagle3 import Eagle3Drafter
    from specdec_cuda.train.eagle3 import eagle3_report, head_from_target
    from specdec_cuda.train.teacher import Teacher

    prompts, result, target, features, lines = _teacher_forced(
        "eagle3", target_dir, 120, T.DrafterSpec(eagle3_steps=2, eagle3_intermediate=32))
    trained = Eagle3Drafter.load(result.folder).attach(target)
    assert features.generated_tokens() == 0 and sorted(features.hidden) == sorted({*trained.config.target_layers, -1})
    teacher = Teacher(target, trained.target_ids())
    start = Eagle3Drafter.random(trained.config, d2t=trained.d2t, t2d=trained.t2d).attach(target)
    head_from_target(start, teacher)
    fitted, untrained = (eagle3_report(d, teacher, features, 2)["positions"] for d in (trained, start))
    assert fitted[0]["top1"] > untrained[0]["top1"] + 0.05
    ar = specdec_cuda.generate(target, prompts[:4], max_new_tokens=12).tokens
    out = specdec_cuda.generate(target, prompts[:4], method="eagle3", max_new_tokens=12, policy="fixed")
    assert out.tokens == ar and sum(out.metrics.drafted) > 0
    with pytest.raises(ValueError, match="gen_tokens 0"):  # DFlash's labels are generated tokens
        T.train("dflash", target_dir, prompts=prompts, distill=F.DistillSpec(gen_tokens=0), log=lambda s: None)
    # Medusa on the same text reads the final state from EAGLE-3's cache: nothing is computed again.
    lines.clear()
    T.train("medusa", target_dir, prompts=prompts, distill=F.DistillSpec(gen_tokens=0, batch_size=16),
            loop=T.LoopSpec(steps=2, batch_size=16), log=lines.append)
    assert any("holds these sequences with more layers; reading layers [-1]" in line for line in lines)
    assert not any("the target reads" in line for line in lines)
    # Fine-tuning (init=): the drafter starts from the trained one (its vocabulary and shape kept),
    # here on the target's continuations; the other kinds refuse init=.
    lines.clear()
    tuned = T.train("eagle3", target_dir, prompts=prompts, distill=DISTILL, init=result.folder,
                    out=result.folder.parent / "tuned", loop=T.LoopSpec(steps=20, batch_size=16, lr=1e-3),
                    drafter=T.DrafterSpec(eagle3_steps=2), log=lines.append)
    assert any("fine-tuning the given drafter" in line for line in lines)
    again = Eagle3Drafter.load(tuned.folder)
    assert torch.equal(again.d2t, trained.d2t) and again.config.intermediate_size == 32
    with pytest.raises(ValueError, match="init="):
        T.train("dflash", target_dir, prompts=prompts, distill=DISTILL, init=result.folder, log=lambda s: None)


@pytest.mark.parametrize("kind", ["medusa", "mtp"])
def test_medusa_and_mtp_learn_the_targets_choices_from_text_it_reads(target_dir, kind):
    # Teacher forcing for Medusa / MTP: the sequences are the prompts, the labels the target's
    # greedy choices over them (checked against its own forward); only the final state is cached.
    # Fit on the sequences trained on (a random tiny target, whose choices vary too little for the
    # held-out report's positions to tell): the trained drafter's loss is well below the untrained
    # one's, and the method finds it and decodes exactly.
    from specdec_cuda.models.heads import MedusaHeads, MTPModules, load_heads, mtp_block_config, target_head
    from specdec_cuda.train.heads import Scorer, _follows, _labels, medusa_loss, mtp_loss

    prompts, result, target, features, _ = _teacher_forced(kind, target_dir, 150,
                                                           T.DrafterSpec(medusa_heads=2, mtp_modules=2))
    assert features.generated_tokens() == 0 and sorted(features.hidden) == [-1]
    head = target_head(target)
    scorer, rows = Scorer(head, None), list(range(len(features)))
    tokens, generated, hidden = features.batch(rows, (-1,))
    labels, counts = _labels(scorer, features, rows, tokens, generated, hidden[-1])
    logits = target.forward(tokens, torch.arange(tokens.shape[1]).expand_as(tokens),
                            target.new_cache(len(rows), tokens.shape[1])).logits
    assert torch.equal(labels[:, 1:], logits.argmax(-1)[:, :-1]) and bool(counts[:, 1:].all())
    # Over a subset of the vocabulary (as on a large one) labels are the scorer's indices: whether a
    # token is the target's choice is asked in those ids too.
    ids = torch.arange(0, 64, 2)
    sub = Scorer(head, ids)
    sub_labels, _ = _labels(sub, features, rows, tokens, generated, hidden[-1])
    choice = ids[sub_labels[:, 1:].clamp(min=0)]  # [B, T - 1] the target's choice among the even ids
    assert torch.equal(_follows(sub, tokens, sub_labels)[:, 1:], tokens[:, 1:] == choice)
    torch.manual_seed(0)
    untrained = MedusaHeads(32, 2) if kind == "medusa" else MTPModules(mtp_block_config(head), 2)

    def loss(drafter) -> float:
        with torch.no_grad():
            return float(medusa_loss(drafter, scorer, features, rows) if kind == "medusa"
                         else mtp_loss(drafter, head, scorer, features, rows))

    assert loss(load_heads(result.folder)) < 0.8 * loss(untrained)
    ar = specdec_cuda.generate(target, prompts[:4], max_new_tokens=12).tokens
    out = specdec_cuda.generate(target, prompts[:4], method=kind, max_new_tokens=12, policy="fixed")
    assert out.tokens == ar and sum(out.metrics.drafted) > 0
    # Fine-tuning (init=) on the target's continuations: the heads start as the trained ones (their
    # count kept over DrafterSpec's); heads of the other kind are refused.
    lines = []
    tuned = T.train(kind, target_dir, prompts=prompts, distill=DISTILL, init=result.folder,
                    out=result.folder.parent / "tuned", loop=T.LoopSpec(steps=4, batch_size=16), log=lines.append)
    assert any("fine-tuning the given" in line for line in lines)
    assert len(load_heads(tuned.folder).topk_accuracy) == 2
    other = "mtp" if kind == "medusa" else "medusa"
    with pytest.raises(ValueError, match=f"holds {kind} heads, not {other}"):
        T.train(other, target_dir, prompts=prompts, distill=DISTILL, init=result.folder, log=lambda s: None)


def test_resumed_training_reuses_the_cached_data(target_dir):
    prompts = _prompts()
    lines = []
    T.train("mtp", target_dir, prompts=prompts, distill=DISTILL, loop=LOOP, log=lines.append)
    assert any("the target continues" in line for line in lines)
    lines.clear()
    T.train("medusa", target_dir, prompts=prompts, distill=DISTILL, loop=LOOP, log=lines.append)
    assert not any("the target continues" in line for line in lines)  # one cache for every kind


def test_the_dflash_loss_decay_reaches_the_loss(tmp_path, target_dir, monkeypatch):
    from specdec_cuda.train import dflash as D

    seen, real = [], D.block_loss
    monkeypatch.setattr(D, "block_loss", lambda *a: seen.append(a[-1]) or real(*a))  # gamma: the last argument
    result = T.train("dflash", target_dir, prompts=_prompts(), distill=DISTILL, loop=LOOP, out=tmp_path / "d",
                     drafter=T.DrafterSpec(dflash_block_size=4, dflash_gamma=2.5), log=lambda s: None)
    assert seen and set(seen) == {2.5}
    assert json.loads((result.folder / "report.json").read_text())["drafter"]["dflash_gamma"] == 2.5


def test_a_dflash_draft_vocabulary_is_the_training_texts_most_frequent_ids(tmp_path, target_dir):
    # --draft-vocab N: the drafter keeps the N most frequent ids of its training sequences, and its
    # methods run the head over them by default (lossless all the same).
    from specdec_cuda.models.dflash import DFlashDrafter

    prompts = _prompts()
    result = T.train("dflash", target_dir, prompts=prompts, distill=DISTILL, loop=LOOP, out=tmp_path / "d",
                     drafter=T.DrafterSpec(dflash_block_size=4, dflash_draft_vocab=12), log=lambda s: None)
    target = models.load(target_dir)
    trained_on = _trained_on(target)
    counts = torch.bincount(trained_on.tokens, minlength=target.vocab_size)
    vocab = DFlashDrafter.load(result.folder).config.draft_vocab
    assert len(vocab) == 12 and counts[list(vocab)].min() >= counts[[i for i in range(target.vocab_size)
                                                                      if i not in vocab]].max()
    report = json.loads((result.folder / "report.json").read_text())
    assert 0 < report["held_out"]["draft_vocab_coverage"] == pytest.approx(float(counts[list(vocab)].sum() / counts.sum()), abs=1e-4)
    ar = specdec_cuda.generate(target, prompts[:4], max_new_tokens=12).tokens
    for method in ("dflash", "ddtree"):
        out = specdec_cuda.generate(target, prompts[:4], method=method, drafter=result.folder, max_new_tokens=12,
                                    policy="fixed")
        assert out.tokens == ar and sum(out.metrics.drafted) > 0


def test_dflash_weights_rounded_to_bfloat16_are_what_is_reported_and_saved(tmp_path, target_dir):
    # --dflash-weights bfloat16: the weights are bfloat16 numbers before the held-out report, the
    # file holds them in bfloat16, and the drafter decodes losslessly from them.
    from safetensors import safe_open

    from specdec_cuda.models.dflash import DFlashDrafter

    prompts = _prompts()
    result = T.train("dflash", target_dir, prompts=prompts, distill=DISTILL, loop=LOOP, out=tmp_path / "d",
                     drafter=T.DrafterSpec(dflash_block_size=4, dflash_weights="bfloat16"), log=lambda s: None)
    assert json.loads((result.folder / "report.json").read_text())["drafter"]["dflash_weights"] == "bfloat16"
    with safe_open(str(result.folder / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
    loaded = DFlashDrafter.load(result.folder)
    assert all(torch.equal(p, p.bfloat16().float()) for p in loaded.parameters())
    target = models.load(target_dir)
    ar = specdec_cuda.generate(target, prompts[:3], max_new_tokens=10).tokens
    out = specdec_cuda.generate(target, prompts[:3], method="dflash", drafter=result.folder, max_new_tokens=10,
                                policy="fixed")
    assert out.tokens == ar and sum(out.metrics.drafted) > 0
    with pytest.raises(ValueError, match="dflash weights"):
        T.train("dflash", target_dir, prompts=prompts, distill=DISTILL, loop=LOOP, out=tmp_path / "e",
                drafter=T.DrafterSpec(dflash_block_size=4, dflash_weights="float16"), log=lambda s: None)


def test_the_cli_trains_from_a_prompts_file(tmp_path):
    from specdec_cuda.train.__main__ import main

    folder = make_checkpoint(tmp_path / "target", vocab=4096, layers=2, seed=1)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ZOO_TOKENIZER / name, folder / name)
    lines = [f"def f{i}(x):\n    return x + {i}" for i in range(24)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": s}) + "\n" for s in lines))
    out = tmp_path / "heads"
    assert main(["medusa", "--target", str(folder), "--prompts", str(tmp_path / "p.jsonl"), "--out", str(out),
                 "--steps", "5", "--gen-tokens", "8", "--heads", "2"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["kind"] == "medusa" and cfg["num_heads"] == 2 and (out / "report.json").is_file()
    assert main(["eagle3", "--target", str(folder), "--data", str(tmp_path / "nothing")]) == 2  # a clear error
    text = tmp_path / "code.py"
    text.write_text("\n".join(lines) * 4)
    assert main(["exit", "--target", str(folder), "--data", str(text), "--out", str(tmp_path / "exit"), "--steps", "3",
                 "--num-prompts", "20", "--prompt-tokens", "16", "--exit-layer", "1", "--exit-mlp", "8",
                 "--draft-vocab", "3"]) == 0
    cfg = json.loads((tmp_path / "exit" / "config.json").read_text())
    assert cfg["model_type"] == "exit_adapter" and cfg["exit_layer"] == 1 and cfg["draft_vocab_size"] == 3
    report = json.loads((tmp_path / "exit" / "report.json").read_text())
    assert report["distill"]["gen_tokens"] == 0  # the CLI's default for exit: the target reads the windows


# -- memory ---------------------------------------------------------------------------------------

_HEAP_PROBE = """
import sys, torch
from specdec_cuda.train.allocator import bound_allocator_growth
def rss_mb():
    return next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
if sys.argv[1] == "bounded":
    assert bound_allocator_growth()
big = torch.ones(24 << 18); del big  # a 24 MB block, mmapped; freeing it raises glibc's mmap threshold
base = rss_mb()
blocks = [torch.ones(8 << 18) for _ in range(4)]  # 4 x 8 MB, touched
del blocks
print(rss_mb() - base)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_training_blocks_go_back_to_the_system():
    """Blocks of a size a training step allocates and frees are unmapped once the allocator is
    bounded; by default glibc keeps them in its heap after one larger block was freed, which is how
    the real EAGLE-3 run grew to the machine's memory (allocator.py)."""
    import subprocess

    package_root = str(Path(specdec_cuda.__file__).resolve().parents[1])  # the subprocess imports this copy

    def kept_mb(mode):
        out = subprocess.run([sys.executable, "-c", _HEAP_PROBE, mode], capture_output=True, text=True, check=True,
                             env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=package_root))
        return int(out.stdout.split()[-1])

    assert kept_mb("default") >= 24  # the mechanism: glibc kept the 32 MB freed
    assert kept_mb("bounded") <= 4


# -- the drafter cache ------------------------------------------------------------------------------


def test_the_fingerprint_follows_the_weights(tmp_path, target_dir):
    a32, a64 = models.load(target_dir), models.load(target_dir, dtype=torch.float64)
    assert drafters.fingerprint(a32) == drafters.fingerprint(a64)  # the same values in another dtype
    other = models.load(make_checkpoint(tmp_path / "other", layers=4, seed=1))
    assert drafters.fingerprint(other) != drafters.fingerprint(a32)


def test_methods_without_a_drafter_name_the_train_command(target_dir):
    target = models.load(target_dir)
    for method in ("medusa", "dflash", "ddtree", "eagle3"):
        with pytest.raises(FileNotFoundError, match=rf"fingerprint {drafters.fingerprint(target)}.*specdec_cuda.train"):
            specdec_cuda.generate(target, [[1, 2]], method=method, max_new_tokens=2)


def test_registered_and_extra_roots(tmp_path, target_dir, monkeypatch):
    from specdec_cuda.models.heads import random_heads, save_heads

    target = models.load(target_dir)
    heads = save_heads(tmp_path / "shared" / drafters.fingerprint(target) / "medusa",
                       random_heads(target, "medusa", 2, seed=0))
    assert drafters.find(target, "medusa") is None
    monkeypatch.setenv("SPECDEC_DRAFTERS_PATH", str(tmp_path / "shared"))
    assert drafters.find(target, "medusa") == heads
    mine = save_heads(tmp_path / "mine", random_heads(target, "medusa", 3, seed=1))
    drafters.register(target, "medusa", mine)
    try:
        assert drafters.find(target, "medusa") == mine
    finally:
        drafters._registered.clear()
    with pytest.raises(ValueError, match="kind"):
        drafters.find(target, "typo")
