"""The speculative loop: greedy speculative == greedy autoregressive, token for token.

Tiny random Llama checkpoints (fp64, so no near-tie flips), both model backends (the built-in
model and a transformers model behind HFCausalLM), batches of prompts of different lengths.
The draft is the target with perturbed weights: it agrees often but not always, so rows accept
different numbers of tokens at every step.
"""

from __future__ import annotations

import pytest
import torch

import specdec_cuda
from decoding_models import load_backend, make_checkpoint

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [11, 12], [30, 31, 32, 33], [7], [40, 41, 42], [50, 2]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoding")
    target = make_checkpoint(root / "target", seed=0)
    draft = make_checkpoint(root / "draft", perturb_from=target, noise=0.05, seed=1)
    return target, draft


@pytest.fixture(scope="module", params=["builtin", "hf"])
def pair(request, folders):
    return request.param, load_backend(folders[0], request.param), load_backend(folders[1], request.param)


def _ar(target, prompts, n=24, **kw):
    return specdec_cuda.generate(target, prompts, max_new_tokens=n, **kw)


@pytest.mark.parametrize("batch", [1, 4, 8])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_greedy_speculative_equals_autoregressive(pair, batch, k):
    backend, target, draft = pair
    if backend == "hf" and k != 4 and batch != 4:  # the adapter is slower: a cross, not the full grid
        pytest.skip("subset of the grid on the HF backend")
    prompts = PROMPTS[:batch]
    ar = _ar(target, prompts)
    sd = specdec_cuda.generate(target, prompts, method="draft", draft=draft, k=k, max_new_tokens=24,
                               policy="fixed")  # every step drafts k (the policy may choose fewer)
    assert sd.tokens == ar.tokens
    assert all(len(t) == 24 for t in sd.tokens)
    assert 1.0 <= sd.metrics.tau <= k + 1
    assert sd.metrics.target_forwards < ar.metrics.target_forwards  # the draft did get accepted


@pytest.mark.parametrize("threshold", [None, 0.6])
def test_greedy_adaptive_k_equals_autoregressive(pair, threshold):
    _, target, draft = pair
    ar = _ar(target, PROMPTS, n=30)
    sd = specdec_cuda.generate(target, PROMPTS, method="draft", draft=draft, k=2, adaptive_k=True,
                               confidence_threshold=threshold, max_new_tokens=30)
    assert sd.tokens == ar.tokens
    assert len(sd.metrics.acceptance) == 4  # k_max defaults to 2k


@pytest.mark.parametrize("verification", ["match", "typical"])
def test_greedy_other_verification_modes(pair, verification):
    _, target, draft = pair
    ar = _ar(target, PROMPTS[:4])
    sd = specdec_cuda.generate(target, PROMPTS[:4], method="draft", draft=draft, k=3, verification=verification,
                               max_new_tokens=24)
    assert sd.tokens == ar.tokens  # at temperature 0 every mode verifies greedily


def test_autoregressive_matches_transformers_greedy(folders):
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(folders[0], dtype=torch.float64).eval()
    prompt = PROMPTS[1]
    expected = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                           attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):]
    for backend in ("builtin", "hf"):
        out = _ar(load_backend(folders[0], backend), [prompt], n=16)
        assert out.tokens[0] == expected.tolist(), backend


def test_draft_equal_to_target_accepts_everything(folders):
    target = load_backend(folders[0], "builtin")
    out = specdec_cuda.generate(target, PROMPTS[:4], method="draft", draft=target, k=4, max_new_tokens=20,
                                policy="fixed")
    assert out.metrics.acceptance == [1.0] * 4
    assert out.tokens == _ar(target, PROMPTS[:4], n=20).tokens
    # 20 tokens: 1 from prefill, then steps of 5 (4 drafts + bonus), the last step cut at the budget.
    assert out.metrics.target_forwards == 4


def test_eos_inside_an_accepted_run(folders):
    target = load_backend(folders[0], "builtin")
    ar = _ar(target, PROMPTS[:1], n=20).tokens[0]
    # An EOS id the target emits at index 3 (not earlier): with a perfect drafter and k=4 it lies in
    # the middle of the first accepted run (indices 1 .. 5).
    index = next(i for i in range(2, 6) if ar[i] not in ar[:i])
    eos = ar[index]
    out = specdec_cuda.generate(target, PROMPTS[:1], method="draft", draft=target, k=4, max_new_tokens=20,
                                eos_token_id=eos, policy="fixed")
    assert out.tokens[0] == ar[: index + 1]
    assert out.tokens == _ar(target, PROMPTS[:1], n=20, eos_token_id=eos).tokens


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 7])
def test_max_new_tokens_reached_mid_run(folders, max_new_tokens):
    target = load_backend(folders[0], "builtin")
    out = specdec_cuda.generate(target, PROMPTS[:3], method="draft", draft=target, k=4,
                                max_new_tokens=max_new_tokens, policy="fixed")
    assert [len(t) for t in out.tokens] == [max_new_tokens] * 3
    assert out.tokens == _ar(target, PROMPTS[:3], n=max_new_tokens).tokens


def test_rows_finish_at_different_steps(folders):
    target, draft = (load_backend(f, "builtin") for f in folders)
    ar = _ar(target, PROMPTS, n=24).tokens
    # An EOS id that ends some rows early and not others.
    firsts = {}
    for row in ar:
        for i, t in enumerate(row):
            firsts.setdefault(t, []).append(i)
    eos = max(firsts, key=lambda t: (len(set(firsts[t])) > 1, len(firsts[t])))
    expected = [row[: row.index(eos) + 1] if eos in row else row for row in ar]
    assert len({len(r) for r in expected}) > 1
    streamed = [[] for _ in PROMPTS]
    out = specdec_cuda.generate(target, PROMPTS, method="draft", draft=draft, k=4, max_new_tokens=24,
                                eos_token_id=eos, stream=lambda row, toks: streamed[row].extend(toks))
    assert out.tokens == expected
    assert streamed == expected


def test_reusable_decoder_and_prompt_forms(folders):
    target, draft = (load_backend(f, "builtin") for f in folders)
    dec = specdec_cuda.SpeculativeDecoder(target, method="draft", draft=draft, k=3)
    a = dec.generate([PROMPTS[0]], max_new_tokens=10)
    b = dec.generate(torch.tensor(PROMPTS[0]), max_new_tokens=10)
    assert a.tokens == b.tokens == _ar(target, [PROMPTS[0]], n=10).tokens


def test_transformers_model_is_wrapped(folders):
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(folders[0], dtype=torch.float64).eval()
    out = specdec_cuda.generate(hf, PROMPTS[:2], max_new_tokens=8)
    assert out.tokens == _ar(load_backend(folders[0], "builtin"), PROMPTS[:2], n=8).tokens


def test_bad_arguments(folders, tmp_path):
    target = load_backend(folders[0], "builtin")
    with pytest.raises(ValueError, match="method"):
        specdec_cuda.generate(target, PROMPTS[:1], method="no_such_method")
    with pytest.raises(ValueError, match="needs draft="):
        specdec_cuda.generate(target, PROMPTS[:1], method="draft")
    with pytest.raises(ValueError, match="vocabulary"):
        specdec_cuda.generate(target, [[1, 64]])
    with pytest.raises(ValueError, match="seed has 3 values"):
        specdec_cuda.generate(target, PROMPTS[:2], seed=[1, 2, 3])
    with pytest.raises(ValueError, match="verification"):
        specdec_cuda.generate(target, PROMPTS[:1], method="draft", draft=target, verification="exact")
    small = make_checkpoint(tmp_path / "small_vocab", vocab=32)
    with pytest.raises(ValueError, match="share a tokenizer"):
        specdec_cuda.generate(target, PROMPTS[:1], method="draft", draft=load_backend(small, "builtin"))


def test_bad_checkpoint_folders(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        specdec_cuda.generate(str(tmp_path / "missing"), [[1]])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        specdec_cuda.generate(str(tmp_path / "empty"), [[1]])
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}')
    with pytest.raises(specdec_cuda.models.UnsupportedModelError, match="gpt2"):
        specdec_cuda.generate(str(gpt2), [[1]])
