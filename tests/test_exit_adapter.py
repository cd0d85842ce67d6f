"""The exit adapter of ``method="layer_skip"`` (Kangaroo; ``models.exit_adapter``).

The conformance suite runs ``layer_skip`` with a random adapter (greedy identity, chi-square,
sample-and-match); here: the cached forward against the whole-sequence one, every drafted chain
against a reference draft model recomputed from scratch, the adapter's cache against the stream of
the final sequence, checkpoints, the drafter cache, and errors (a GGUF target: test_gguf_model).
"""

from __future__ import annotations

import pytest
import torch

import specdec_cuda
from _models_testlib import random_exit_adapter
from decoding_models import make_checkpoint
from specdec_cuda import models
from specdec_cuda.decoding import SamplingParams, decode
from specdec_cuda.models.exit_adapter import ExitAdapter, ExitAdapterConfig, default_exit_layer
from specdec_cuda.proposers.layer_skip import LayerSkipProposer


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("exit_adapter") / "target", vocab=64, hidden=32, layers=4, seed=2)


def _adapter(model, exit_layer=2, mlp=24, ids=None, seed=1):
    ids = torch.tensor([i for i in range(model.vocab_size) if i % 3]) if ids is None else ids
    return random_exit_adapter(model, exit_layer=exit_layer, mlp=mlp, ids=ids, seed=seed)


def _prompts():
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 64, (n,), generator=g).tolist() for n in (9, 17, 4)]


def _reference_logits(model, adapter, sequence: list[int]) -> torch.Tensor:
    """The draft model's logits [V] after ``sequence``, from scratch: the target's first layers over
    the whole sequence, the adapter's whole-sequence forward, the final norm and the head over the
    draft vocabulary (-inf elsewhere)."""
    L = adapter.config.exit_layer
    tokens = torch.tensor([sequence])
    n = tokens.shape[1]
    out = model.forward(tokens, torch.arange(n)[None], model.new_cache(1, n), layers=tuple(range(L)),
                        hidden_layers=(L - 1,))
    stream = adapter.forward_full(out.hidden_states[L - 1])[0, -1]
    head = model.lm_head.weight if model.lm_head is not None else model.embed_tokens.weight
    logits = torch.full((model.vocab_size,), float("-inf"), dtype=torch.float64)
    ids = adapter.draft_ids
    logits[ids] = (head[ids] @ model.norm(stream.to(head.dtype))).double()
    return logits


@pytest.mark.parametrize("mlp", [0, 24])
def test_cached_steps_equal_the_whole_sequence_forward(folder, mlp):
    model = models.load(folder, dtype=torch.float64)
    adapter = _adapter(model, mlp=mlp)
    g = torch.Generator().manual_seed(0)
    s = torch.randn(2, 11, 32, generator=g, dtype=torch.float64)
    whole = adapter.forward_full(s)
    cache = adapter.new_cache(2, 16)
    lengths = torch.tensor([5, 3])  # ragged prompts: padding columns go to the trash slot
    first = adapter.step(s[:, :5], torch.arange(5).expand(2, 5), cache, num_new=lengths)
    cache.commit(lengths)
    assert torch.allclose(first[0], whole[0, :5], atol=1e-12) and torch.allclose(first[1, :3], whole[1, :3], atol=1e-12)
    # Then one position per row at a time, as scratch (offsets 0, 1), then committed from the truth.
    for offset in range(2):
        pos = cache.lengths[:, None] + offset
        out = adapter.step(s[torch.arange(2)[:, None], pos], pos, cache, offset=offset)
        for b in range(2):
            assert torch.allclose(out[b, 0], whole[b, int(pos[b])], atol=1e-12)


def test_every_drafted_chain_is_the_reference_draft_models(folder):
    model = models.load(folder, dtype=torch.float64)
    adapter = _adapter(model)
    proposer = LayerSkipProposer(model, k=3, adapter=adapter)
    assert proposer.layers == (0, 1) and proposer.hidden_layers == (1,)
    seen = []
    propose = proposer.propose

    def recording(state):
        draft = propose(state)
        seen.append((int(state.lengths[0]), int(state.last_tokens[0]), draft.tokens[0].tolist()))
        return draft

    proposer.propose = recording
    prompt = _prompts()[1]
    params = SamplingParams.make(1, 0.0, 0, 1.0, 0, model.device)
    out = decode(model, [prompt], params, 16, proposer=proposer)
    ar = specdec_cuda.generate(model, [prompt], method="autoregressive", max_new_tokens=16)
    assert out.tokens == ar.tokens and len(seen) >= 3
    sequence = prompt + out.tokens[0]
    for length, root, drafted in seen:
        assert sequence[length] == root
        context = sequence[: length + 1]
        for token in drafted:
            assert token == int(_reference_logits(model, adapter, context).argmax())
            context = context + [token]
    # The adapter's cache holds, for every committed position, the K/V of the target's own stream.
    cache = proposer.adapter_cache
    n = int(cache.lengths[0])
    assert n == len(prompt) + len(out.tokens[0]) - 1
    tokens = torch.tensor([sequence[:n]])
    stream = model.forward(tokens, torch.arange(n)[None], model.new_cache(1, n), hidden_layers=(1,)).hidden_states[1]
    _, keys, values = adapter._qkv(stream, torch.arange(n)[None])
    assert torch.allclose(cache.keys[:, :, :n], keys, atol=1e-10)
    assert torch.allclose(cache.values[:, :, :n], values, atol=1e-10)


def test_checkpoints_and_the_drafter_cache(folder, tmp_path, monkeypatch):
    from specdec_cuda import drafters

    monkeypatch.setenv("SPECDEC_DRAFTERS_DIR", str(tmp_path / "drafters"))
    model = models.load(folder, dtype=torch.float64)
    with pytest.raises(FileNotFoundError, match="train exit"):
        LayerSkipProposer(model, adapter=True)
    adapter = _adapter(model)
    adapter.save(drafters.drafter_dir(model, "exit"))
    loaded = LayerSkipProposer(model, adapter=True).adapter
    assert loaded.config == adapter.config and torch.equal(loaded.draft_ids, adapter.draft_ids)
    for name, p in adapter.state_dict().items():
        assert torch.equal(loaded.state_dict()[name].to(p.dtype), p), name


def test_bad_adapters(folder, tmp_path):
    model = models.load(folder, dtype=torch.float64)
    adapter = _adapter(model)
    with pytest.raises(ValueError, match="exit_layer=2"):
        LayerSkipProposer(model, adapter=adapter, exit_layer=3)
    with pytest.raises(ValueError, match="exit_layer=2"):
        LayerSkipProposer(model, adapter=adapter, skip=[1])
    with pytest.raises(TypeError, match="ExitAdapter"):
        LayerSkipProposer(model, adapter=3)
    other = models.load(make_checkpoint(tmp_path / "other", vocab=64, hidden=32, layers=3, seed=5))
    with pytest.raises(ValueError, match="another target"):
        _adapter(other).attach(model)
    with pytest.raises(ValueError, match="exceeds"):
        ExitAdapterConfig.for_target(model, exit_layer=5)
    with pytest.raises(ValueError, match="draft_ids"):
        adapter.set_draft_ids(torch.tensor([3, 2]))
    with pytest.raises(FileNotFoundError, match="not an exit adapter"):
        ExitAdapter.load(tmp_path)
    assert default_exit_layer(28) == 8 and default_exit_layer(1) == 1 and default_exit_layer(4) == 1
