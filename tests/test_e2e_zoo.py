"""Shipping a zoo pair in the repository: the bf16 export, its size limit, and the lookup that
prefers it (the demo and the benches on a fresh machine need no training)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from bench import e2e
from specdec_cuda import models
from zoo import pairs
from zoo.train import main as zoo_main

from test_e2e import save_random_pair


def _dtypes(folder: Path) -> set[str]:
    from safetensors import safe_open

    out = set()
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            out |= {f.get_slice(k).get_dtype() for k in f.keys()}
    return out


def check_shipped(folder: Path) -> None:
    """What a shipped pair must be: both models in bf16 safetensors with config and tokenizer,
    at most 40 MB in all, loading as fp32 on the CPU."""
    assert pairs.folder_bytes(folder) <= pairs.SHIP_LIMIT_BYTES == 40_000_000
    for name in ("target", "draft"):
        assert (folder / name / "config.json").exists() and (folder / name / "tokenizer.json").exists()
        assert _dtypes(folder / name) == {"BF16"}
        assert not list((folder / name).glob("*.bin"))
    pair = e2e.load_pair(folder / "target", folder / "draft")
    assert all(p.dtype == torch.float32 for p in pair.target.parameters())
    assert pair.tokenizer.decode(pair.tokenizer("def f(x):\n")["input_ids"]) == "def f(x):\n"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return save_random_pair(tmp_path_factory.mktemp("src") / "tiny-random",
                            report={"agreement": {"greedy": 0.5, "sampled": 0.5}})


def test_ship_pair_writes_bf16_that_loads_as_fp32(trained, tmp_path):
    dest = tmp_path / "zoo" / "tiny-random"
    shipped = pairs.ship_pair(trained, dest)
    check_shipped(dest)
    assert shipped["dtype"] == "bfloat16" and set(shipped["bytes"]) == {"target", "draft"}
    report = json.loads((dest / "report.json").read_text())
    assert report["agreement"] == {"greedy": 0.5, "sampled": 0.5} and report["shipped"] == shipped
    # The shipped target is the trained one rounded to bf16.
    ids = torch.tensor([[3, 17, 40, 5, 99, 12]])
    positions = torch.arange(ids.shape[1])[None]
    full, half = models.load(trained / "target"), models.load(dest / "target")
    want = full.forward(ids, positions, full.new_cache(1, 8)).logits
    got = half.forward(ids, positions, half.new_cache(1, 8)).logits
    assert got.dtype == torch.float32 and not torch.equal(got, want)
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.05)
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(dest / "target", dtype=torch.float32)
    torch.testing.assert_close(hf(input_ids=ids).logits, got, atol=1e-4, rtol=1e-4)


def test_ship_pair_refuses_more_than_the_limit(trained, tmp_path):
    dest = tmp_path / "zoo" / "tiny-random"
    with pytest.raises(ValueError, match="MB"):
        pairs.ship_pair(trained, dest, limit_bytes=10_000)
    assert not dest.exists() and not list((tmp_path / "zoo").iterdir())
    with pytest.raises(FileNotFoundError, match="not a trained pair"):
        pairs.ship_pair(tmp_path, dest)


def test_get_pair_and_default_prefer_the_shipped_pair(trained, tmp_path, monkeypatch):
    spec = pairs.ZooSpec(name="tiny-random")
    shipped, cache = tmp_path / "shipped", trained.parent
    assert pairs.get_pair(spec, root=cache, shipped=shipped) == (trained / "target", trained / "draft")
    pairs.ship_pair(trained, shipped / spec.name)
    assert pairs.get_pair(spec, root=cache, shipped=shipped) == (shipped / spec.name / "target",
                                                               shipped / spec.name / "draft")
    assert pairs.get_pair(spec, root=cache, shipped=shipped, use_shipped=False)[0] == trained / "target"
    # v4 becomes the default zoo as soon as its pair is shipped (no training on a fresh machine).
    monkeypatch.setattr(pairs, "shipped_root", lambda: shipped)
    monkeypatch.setenv("SPECDEC_ZOO_DIR", str(tmp_path / "empty-cache"))
    assert pairs.default_zoo() == "default"
    shutil.copytree(shipped / spec.name, shipped / pairs.V4_SPEC.name)
    assert pairs.default_zoo() == "v4"
    assert pairs.get_pair(pairs.V4_SPEC)[0] == shipped / pairs.V4_SPEC.name / "target"  # no training run needed


def test_zoo_cli_ships_the_trained_pair(trained, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    shutil.copytree(trained, cache / pairs.DEFAULT_SPEC.name)
    monkeypatch.setenv("SPECDEC_ZOO_DIR", str(cache))
    assert zoo_main(["--ship", str(tmp_path / "out")]) == 0
    assert "shipped to" in capsys.readouterr().out
    check_shipped(tmp_path / "out")


SHIPPED = pairs.shipped_root() / pairs.V4_SPEC.name if pairs.shipped_root() else None


@pytest.mark.skipif(SHIPPED is None or not SHIPPED.exists(), reason="no zoo pair shipped in this checkout")
def test_the_shipped_pair():
    check_shipped(SHIPPED)


def test_zoo_v4_cli_ships_a_finished_run(tmp_path, monkeypatch, capsys):
    from zoo import v4 as zoo_v4

    from test_zoo_v4 import TINY, _corpus

    run = tmp_path / "run"
    zoo_v4.train_v4(run, TINY, corpus=_corpus(), log=lambda _: None)  # the finished run
    monkeypatch.setitem(pairs.SPECS, "v4", TINY)
    monkeypatch.setenv("SPECDEC_ZOO_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(pairs, "shipped_root", lambda: tmp_path / "repo-zoo")
    assert zoo_main(["--zoo", "v4", "--run-dir", str(run), "--ship"]) == 0  # resumes: nothing to train
    assert "shipped to" in capsys.readouterr().out
    check_shipped(tmp_path / "repo-zoo" / TINY.name)
    report = json.loads((tmp_path / "repo-zoo" / TINY.name / "report.json").read_text())
    assert report["target_heldout"] == json.loads((run / "report.json").read_text())["target_heldout"]


def test_zoo_v4_cli_refines_and_ships_a_finished_pair(tmp_path, monkeypatch, capsys):
    from zoo import v4 as zoo_v4

    from test_zoo_v4 import TINY, TINY_PLAIN, _corpus

    zoo_v4.train_v4(tmp_path / "run", TINY_PLAIN, corpus=_corpus(), log=lambda _: None)
    monkeypatch.setitem(pairs.SPECS, "v4", TINY)
    monkeypatch.setenv("SPECDEC_ZOO_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(pairs, "shipped_root", lambda: tmp_path / "repo-zoo")
    monkeypatch.setattr(zoo_v4, "code_corpus", lambda spec, log: _corpus())
    assert zoo_main(["--zoo", "v4", "--unlikelihood"]) == 2  # nothing shipped or cached yet
    zoo_v4.copy_export(tmp_path / "run" / "export", tmp_path / "cache" / TINY.name)
    assert zoo_main(["--zoo", "v4", "--run-dir", str(tmp_path / "run"), "--unlikelihood", "--ship"]) == 0
    assert "shipped to" in capsys.readouterr().out
    check_shipped(tmp_path / "repo-zoo" / TINY.name)
    report = json.loads((tmp_path / "repo-zoo" / TINY.name / "report.json").read_text())
    first = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["refined_from"]["target_heldout"] == first["target_heldout"] and "unlikelihood" in report
    assert report["unlikelihood"]["round"] == 1
    # The shipped pair is refined now: refining it again is a second round, from the shipped pair.
    assert zoo_main(["--zoo", "v4", "--run-dir", str(tmp_path / "run"), "--unlikelihood", "--ship"]) == 0
    again = json.loads((tmp_path / "repo-zoo" / TINY.name / "report.json").read_text())
    assert again["unlikelihood"]["round"] == 2
    assert again["refined_from"]["target_heldout"] == report["target_heldout"]


@pytest.mark.skipif(SHIPPED is None or not (SHIPPED / "heads-medusa").exists(),
                    reason="no heads shipped beside the zoo pair in this checkout")
def test_the_methods_shipped_beside_the_pair():
    # Medusa heads, MTP modules, the DFlash drafter and the diffusion LM trained against the
    # shipped target: they load, fit its width and vocabulary, and the methods' defaults find them.
    from zoo import diffusion as zoo_diffusion
    from specdec_cuda.models.dflash import DFlashDrafter
    from specdec_cuda.models.diffusion_lm import load_diffusion
    from specdec_cuda.models.heads import MedusaHeads, MTPModules, load_heads
    from zoo.dflash import default_drafter_dir

    target = json.loads((SHIPPED / "target" / "config.json").read_text())
    assert isinstance(load_heads(SHIPPED / "heads-medusa"), MedusaHeads)
    assert isinstance(load_heads(SHIPPED / "heads-mtp"), MTPModules)
    assert isinstance(DFlashDrafter.load(SHIPPED / "dflash"), DFlashDrafter)
    assert default_drafter_dir() == SHIPPED / "dflash"
    diffusion = zoo_diffusion.trained_diffusion_dir(zoo_diffusion.V4_SPEC)
    assert diffusion == pairs.shipped_root() / zoo_diffusion.V4_SPEC.name
    model = load_diffusion(diffusion)
    assert model.config.vocab_size == target["vocab_size"] + 1 and model.config.shifted_logits
    assert pairs.folder_bytes(SHIPPED) + pairs.folder_bytes(diffusion) <= 2 * pairs.SHIP_LIMIT_BYTES


@pytest.mark.skipif(SHIPPED is None or not (SHIPPED / "heads-medusa").exists(),
                    reason="no heads shipped beside the zoo pair in this checkout")
def test_the_shipped_drafters_are_the_zoo_targets_cached_ones():
    import specdec_cuda
    from specdec_cuda import drafters, models

    target = models.load(SHIPPED / "target")
    with pytest.raises(FileNotFoundError, match="specdec_cuda.train medusa"):
        specdec_cuda.generate(target, [[1, 2, 3]], method="medusa", max_new_tokens=4)
    try:
        assert {"medusa", "mtp", "dflash"} <= set(pairs.register_drafters(target, SHIPPED))
        assert drafters.find(target, "medusa") == SHIPPED / "heads-medusa"
        ar = specdec_cuda.generate(target, [[1, 2, 3]], max_new_tokens=8).tokens
        for method in ("medusa", "mtp", "dflash"):
            assert specdec_cuda.generate(target, [[1, 2, 3]], method=method, max_new_tokens=8).tokens == ar
    finally:
        drafters._registered.clear()
