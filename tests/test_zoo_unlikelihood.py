"""Sequence-level unlikelihood fine-tuning (zoo_unlikelihood): the loop mask and the loss
against plain references, and a fine-tune that lowers a tiny model's greedy loops."""

from __future__ import annotations

import pytest
import torch

from zoo import unlikelihood as zu


def _reference_loop_mask(row: list[int], start: int, max_period: int, min_span: int) -> list[bool]:
    # Token t is marked when some span row[a:b] of period p <= max_period, b - a >= max(3p, min_span),
    # holds t past its first period (t >= a + p): t then repeats the token p before it.
    marked = [False] * len(row)
    for p in range(1, max_period + 1):
        for a in range(len(row)):
            for b in range(a + max(3 * p, min_span), len(row) + 1):
                if all(row[i] == row[i - p] for i in range(a + p, b)):
                    for t in range(a + p, b):
                        marked[t] = True
    return marked[start:]


def test_loop_mask_matches_reference():
    gen = torch.Generator().manual_seed(3)
    for vocab, max_period, min_span in ((2, 3, 6), (3, 4, 8), (2, 1, 4), (3, 16, 16)):
        seq = torch.randint(0, vocab, (5, 26), generator=gen)
        # Plant a loop of period 3 in the last row, so every case has one.
        seq[-1, 10:] = torch.tensor([4, 5, 6] * 6)[:16] % vocab
        got = zu.loop_mask(seq, 6, max_period, min_span)
        assert got.shape == (5, 20)
        for b in range(5):
            want = _reference_loop_mask(seq[b].tolist(), 6, max_period, min_span)
            assert got[b].tolist() == want, (vocab, max_period, min_span, b)
    # A phrase that stands three times is a loop; twice is not.
    seq = torch.tensor([[9, 8, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 7]])
    assert zu.loop_mask(seq, 2, 16, 12).tolist() == [[False] * 4 + [True] * 8 + [False]]
    assert not zu.loop_mask(seq[:, :11], 2, 16, 12).any()
    # With the collapse test's span (24), a sequence zoo_v4.collapsed calls a loop is marked from
    # the loop's second period on.
    from zoo import v4 as zoo_v4

    looped = torch.tensor([[5, 6, 7] + [11, 12] * 14])
    mask = zu.loop_mask(looped, 3, 16, 24)
    assert zoo_v4.collapsed(looped[0].tolist()) and mask[0, 2:].all() and not mask[0, :2].any()
    with pytest.raises(ValueError, match="0 < start"):
        zu.loop_mask(seq, 15)
    with pytest.raises(ValueError, match="max_period >= 1"):
        zu.loop_mask(seq, 3, 0)


def test_unlikelihood_loss_matches_reference():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 7, 11, generator=gen) * 4
    logits[0, 0, 5] = 60.0  # p rounds to 1 in float32: the loss stays finite
    targets = torch.randint(0, 11, (3, 7), generator=gen)
    targets[0, 0] = 5
    mask = torch.rand(3, 7, generator=gen) < 0.5
    mask[0, 0] = True
    p = torch.softmax(logits.double(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    expected = -(torch.log(torch.clamp(1 - p, min=1e-6)) * mask).sum() / mask.numel()
    got = zu.unlikelihood_loss(logits, targets, mask)
    assert torch.isfinite(got) and got.item() == pytest.approx(expected.item(), rel=1e-4)
    assert zu.unlikelihood_loss(logits, targets, torch.zeros_like(mask)).item() == 0.0


def _tiny_lm(vocab: int = 32):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return LlamaForCausalLM(config)


def test_finetune_lowers_greedy_loops():
    # Text without loops: a shuffled stream.
    data = torch.randperm(32 * 200, generator=torch.Generator().manual_seed(2)) % 32
    prefixes = data[:8 * 8].view(8, 8).long()

    def looped(m) -> dict:
        seq = zu.greedy_continue(m, prefixes, 24)
        return {"loop_fraction": float(zu.loop_mask(seq, 8, 16, 16).float().mean())}

    runs = {}
    for alpha in (0.0, 4.0):  # next-token loss alone is the control
        spec = zu.UnlikelihoodSpec(steps=30, lr=3e-3, warmup_steps=2, prompts=8, prefix_len=8,
                                   continuation_len=24, alpha=alpha, mle_rows=4, mle_seq_len=16,
                                   eval_every=15, log_every=10)
        lines = []
        runs[alpha] = zu.finetune(_tiny_lm(), data, spec, looped, lines.append)
    history = runs[4.0]
    before, after = history["evals"][0]["loop_fraction"], history["evals"][-1]["loop_fraction"]
    control = runs[0.0]["evals"][-1]["loop_fraction"]
    assert [e["step"] for e in history["evals"]] == [0, 15, 30]
    assert before > 0.3 and after < before / 2 and after < control - 0.2, (before, after, control)
    assert len(history["steps"]) == 30 and any("ETA" in line for line in lines)


def test_finetune_stops_when_asked_and_checks_its_data():
    model = _tiny_lm()
    spec = zu.UnlikelihoodSpec(steps=5, prompts=2, prefix_len=4, continuation_len=4, mle_rows=2, mle_seq_len=8)
    data = torch.arange(200) % 32
    assert zu.finetune(model, data, spec, log=lambda _: None, should_stop=lambda: True) is None
    with pytest.raises(ValueError, match="1-D"):
        zu.finetune(model, data.view(10, 20), spec, log=lambda _: None)
    with pytest.raises(ValueError, match=r"prefixes \(N, 4\)"):
        zu.finetune(model, data, spec, log=lambda _: None, prefixes=torch.zeros(3, 5, dtype=torch.long))


def test_finetune_continues_from_the_prefix_pool(monkeypatch):
    # A quarter of each step's prompts come from the pool (code openings in zoo_v4), the rest
    # from random windows of the data.
    seen = []
    real = zu.greedy_continue

    def recording(model, prefixes, new_tokens):
        seen.append(prefixes.clone())
        return real(model, prefixes, new_tokens)

    monkeypatch.setattr(zu, "greedy_continue", recording)
    pool = torch.tensor([[31, 30, 29, 28], [27, 26, 25, 24]])
    data = torch.arange(200) % 20  # never holds 24 .. 31
    spec = zu.UnlikelihoodSpec(steps=3, prompts=4, opening_fraction=0.25, prefix_len=4, continuation_len=4,
                               mle_rows=2, mle_seq_len=8, warmup_steps=1)
    assert zu.finetune(_tiny_lm(), data, spec, log=lambda _: None, prefixes=pool) is not None
    assert len(seen) == 3
    for starts in seen:
        assert starts.shape == (4, 4)
        assert any(torch.equal(starts[0], row) for row in pool) and (starts[1:] < 20).all()
