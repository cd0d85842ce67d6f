"""The zoo trainer (tiny corpus, a few steps), the demo / bench CLI, and bad checkpoint folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specdec_cuda import models
from zoo import pairs
from specdec_cuda.__main__ import main

TINY = pairs.ZooSpec(
    name="tiny", vocab_size=300, max_position=256, seq_len=32, batch_size=4,
    target=pairs.LMConfig(2, 32, 64, 2, 1), draft=pairs.LMConfig(1, 32, 64, 2, 1),
    target_steps=4, draft_steps=3, eval_tokens=256)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    texts = [Path(pairs.__file__).read_text(), Path(models.__file__).read_text()] * 2
    lines = []
    report = pairs.train_pair(root / "tiny", TINY, texts=texts, log=lines.append)
    return root / "tiny", report, lines


def test_draft_init_copies_the_target_layers():
    target = pairs._llama(TINY.target, TINY, 0)
    draft = pairs._llama(TINY.draft, TINY, 0)
    pairs.init_draft_from_target(draft, target)
    ids = torch.randint(0, TINY.vocab_size, (1, 9))
    # The draft is the target with layer 1 dropped: same embedding, layer 0, norm and head.
    with torch.no_grad():
        h = target.model.layers[0](target.model.embed_tokens(ids), position_embeddings=target.model.rotary_emb(
            target.model.embed_tokens(ids), torch.arange(9)[None]))
        h = h[0] if isinstance(h, tuple) else h
        expected = target.lm_head(target.model.norm(h))
        torch.testing.assert_close(draft(input_ids=ids).logits, expected, rtol=1e-5, atol=1e-5)
    narrow = pairs._llama(pairs.LMConfig(1, 16, 32, 2, 1), TINY, 0)
    with pytest.raises(ValueError, match="width"):
        pairs.init_draft_from_target(narrow, target)


def test_zoo_training_saves_loadable_hf_folders(tiny_pair):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, report, lines = tiny_pair
    assert any("ETA" in line for line in lines)  # progress is shown
    assert set(report["agreement"]) == {"greedy", "sampled"} and 0 <= report["agreement"]["greedy"] <= 1
    assert json.loads((folder / "report.json").read_text())["params"] == report["params"]
    for name in ("target", "draft"):
        tok = AutoTokenizer.from_pretrained(folder / name)
        ids = tok("def f(x):\n    return x")["input_ids"]
        assert tok.decode(ids) == "def f(x):\n    return x"
        hf = AutoModelForCausalLM.from_pretrained(folder / name).eval()
        ours = models.load(folder / name)
        x = torch.tensor([ids])
        cache = ours.new_cache(1, x.shape[1])
        got = ours.forward(x, torch.arange(x.shape[1])[None], cache).logits
        torch.testing.assert_close(got, hf(input_ids=x).logits, atol=1e-4, rtol=1e-4)


def test_zoo_training_is_reproducible(tiny_pair, tmp_path):
    folder, report, _ = tiny_pair
    texts = [Path(pairs.__file__).read_text(), Path(models.__file__).read_text()] * 2
    again = pairs.train_pair(tmp_path / "tiny", TINY, texts=texts, log=lambda _: None)
    assert again["target_eval_loss"] == pytest.approx(report["target_eval_loss"], rel=1e-5)


def test_get_pair_uses_the_cache(tiny_pair, monkeypatch):
    folder, _, _ = tiny_pair
    monkeypatch.setattr(pairs, "train_pair", lambda *a, **k: pytest.fail("retrained a cached pair"))
    target, draft = pairs.get_pair(TINY, root=folder.parent)
    assert target == folder / "target" and draft == folder / "draft"


def test_demo_runs_on_given_folders(tiny_pair, capsys):
    folder, _, _ = tiny_pair
    rc = main(["demo", "--target", str(folder / "target"), "--draft", str(folder / "draft"),
               "--max-new-tokens", "12", "--prompts", "2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "tokens/s" in out and "greedy identical" in out
    table = out[out.index("greedy identical"):]
    assert "NO" not in table and table.count("yes") == 5  # AR, k, adaptive k, cost policy, prompt lookup


def test_bench_quick_writes_json(tiny_pair, tmp_path, capsys):
    folder, _, _ = tiny_pair
    out = tmp_path / "e2e.json"
    rc = main(["bench", "--quick", "--repeats", "1", "--target", str(folder / "target"), "--draft",
               str(folder / "draft"), "--out", str(out)])
    assert rc == 0
    result = json.loads(out.read_text())
    assert result["batches"] == [1, 4] and result["max_new_tokens"] == 32 and result["prompts_per_workload"] == 4
    methods = {r["method"] for r in result["rows"]}
    assert {"transformers generate + assistant_model", "engine draft (k=4)", "engine autoregressive"} <= methods
    greedy_spec = [r for r in result["rows"] if r["method"].startswith("engine draft") and r["temperature"] == 0.0]
    assert len(greedy_spec) == 12 and all(r["identical"] for r in greedy_spec)  # 3 configs x 2 workloads x 2 batches
    assert result["headline"]["workload"] == "held-out"


def test_cli_bad_checkpoint_folders(tmp_path, capsys):
    assert main(["demo", "--target", str(tmp_path / "nope"), "--draft", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["bench", "--target", str(tmp_path / "empty"), "--draft", str(tmp_path / "empty")]) == 2
    assert "config.json" in capsys.readouterr().err
    weird = tmp_path / "weird"
    weird.mkdir()
    (weird / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    assert main(["demo", "--target", str(weird), "--draft", str(weird)]) == 2
    assert "gpt2" in capsys.readouterr().err
    assert main(["demo", "--draft", str(weird)]) == 2
