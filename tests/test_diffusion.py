"""Diffusion-LM generation: the ``diffusion_unmask`` kernel against its reference, the model, the
generator and the zoo training (tiny spec).

Kernel outputs that are integers (tokens, keep masks, statuses) must equal the reference exactly:
both draw the same Philox numbers, and float rounding could only flip a decision at an exact
near-tie of two confidences, which these fixed seeds do not meet. Confidences agree to rounding.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import specdec_cuda
import specdec_cuda.ops as ops
from specdec_cuda.decoding import SamplingParams
from specdec_cuda.diffusion_generate import (DIFFUSION_OPTIONS, DiffusionGenerator, make_diffusion,
                                             transfer_schedule)
from specdec_cuda.models.config import UnsupportedModelError
from specdec_cuda.models.diffusion_lm import DiffusionConfig, DiffusionLM, load_diffusion
from specdec_cuda.reference import diffusion as ref
from specdec_cuda.reference.philox import Purpose
from sampling_cases import llm_like_logits

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
MASK = 7  # mask id of the kernel tests (a vocabulary entry like any other for the kernel)


def make_case(batch, width, vocab, *, seed=0, dtype=torch.float32, masked_fraction=0.6,
              threshold_fraction=0.3, filters=True):
    """A diffusion_unmask batch mixing greedy / sampled rows, top-k / top-p, top-n / threshold."""
    g = torch.Generator().manual_seed(seed)
    logits = llm_like_logits(batch * width, vocab, g).view(batch, width, vocab).to(dtype)
    tokens = torch.randint(0, vocab, (batch, width), generator=g)
    tokens[tokens == MASK] = MASK + 1 if MASK + 1 < vocab else 0
    tokens[torch.rand(batch, width, generator=g) < masked_fraction] = MASK
    temperature = torch.rand(batch, generator=g) * 1.2 + 0.3
    temperature[torch.rand(batch, generator=g) < 0.3] = 0.0
    top_k = torch.zeros(batch, dtype=torch.int32)
    top_p = torch.ones(batch)
    if filters:
        pick = torch.rand(batch, generator=g)
        top_k[pick < 0.3] = 5
        top_p[(pick >= 0.3) & (pick < 0.6)] = 0.8
        both = (pick >= 0.6) & (pick < 0.75)
        top_k[both] = max(1, vocab // 3)
        top_p[both] = 0.6
    threshold = torch.where(torch.rand(batch, generator=g) < threshold_fraction,
                            torch.rand(batch, generator=g) * 0.8 + 0.1, torch.zeros(batch))
    return dict(
        logits=logits, tokens=tokens, mask_id=MASK, temperature=temperature, top_k=top_k, top_p=top_p,
        seed=torch.randint(0, 2**40, (batch,), generator=g), position=torch.randint(0, 500, (batch,), generator=g),
        step=torch.randint(0, 50, (batch,), generator=g),
        num_transfer=torch.randint(0, width + 2, (batch,), generator=g), threshold=threshold)


def assert_matches_reference(case, device="cpu"):
    moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    out = ops.diffusion_unmask(**moved)
    sampled, confidence, keep, status = ref.diffusion_unmask(**case)
    assert torch.equal(out.status.cpu(), status), (out.status, status)
    assert torch.equal(out.sampled.cpu(), sampled), (out.sampled, sampled)
    assert torch.equal(out.keep.cpu(), keep), (out.keep, keep)
    torch.testing.assert_close(out.confidence.cpu(), confidence, rtol=2e-5, atol=1e-7)
    return out


# ---- the kernel against the reference --------------------------------------------------------------

@pytest.mark.parametrize("batch,width,vocab", [(1, 1, 111), (7, 13, 111), (3, 32, 111), (2, 5, 2049)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_unmask_matches_reference(batch, width, vocab, dtype):
    case = make_case(batch, width, vocab, seed=batch * 31 + width + vocab, dtype=dtype)
    out = assert_matches_reference(case)
    masked = case["tokens"] == MASK
    assert bool((out.keep <= masked).all()), "only masked positions are unmasked"
    assert bool(((out.sampled >= 0) == masked).all())


def test_unmask_float64_and_strided_logits():
    case = make_case(4, 9, 111, seed=5, dtype=torch.float64)
    assert_matches_reference(case)
    # a block's slice of a longer sequence's logits, read in place
    full = llm_like_logits(4 * 20, 111, torch.Generator().manual_seed(1)).view(4, 20, 111)
    case = make_case(4, 9, 111, seed=6)
    case["logits"] = full[:, 6:15]
    assert not case["logits"].is_contiguous()
    assert_matches_reference(case)


def test_top_n_keeps_exactly_n_and_threshold_rule():
    case = make_case(16, 24, 111, seed=9, threshold_fraction=0.5)
    out = assert_matches_reference(case)
    masked = case["tokens"] == MASK
    for b in range(16):
        kept, conf = out.keep[b], out.confidence[b]
        if float(case["threshold"][b]) > 0:
            best = int(torch.argmax(torch.where(masked[b], conf, -math.inf)))
            if masked[b].any():
                assert kept[best]
            expected = masked[b] & (conf >= case["threshold"][b])
            expected[best] = bool(masked[b].any())
            assert torch.equal(kept, expected)
        else:
            n = min(int(case["num_transfer"][b]), int(masked[b].sum()))
            assert int(kept.sum()) == n
            if 0 < n < int(masked[b].sum()):  # every kept one at least as confident as every other
                assert float(conf[kept].min()) >= float(conf[masked[b] & ~kept].max())


def test_greedy_is_argmax_with_softmax_confidence():
    logits = llm_like_logits(12, 50, torch.Generator().manual_seed(2)).view(3, 4, 50)
    tokens = torch.full((3, 4), MASK)
    out = ops.diffusion_unmask(logits, tokens, MASK, temperature=0.0, num_transfer=2)
    assert torch.equal(out.sampled, logits.argmax(-1))
    torch.testing.assert_close(out.confidence, torch.softmax(logits, -1).amax(-1))
    assert out.keep.sum(1).tolist() == [2, 2, 2]


def test_statuses():
    case = make_case(6, 8, 111, seed=3, threshold_fraction=0.0, filters=False)
    case["tokens"][:, 0] = MASK
    case["tokens"][:, 1] = 3  # an unmasked position: its logits are never read
    case["logits"][0, 0, 5] = float("nan")
    case["logits"][1, 1, :] = float("nan")
    case["temperature"][2] = -1.0
    case["threshold"][3] = float("nan")
    case["num_transfer"][4] = -1
    case["logits"][5, 0, :] = -math.inf
    out = assert_matches_reference(case)
    assert out.status.tolist() == [1, 0, 3, 3, 3, 1]
    assert not out.keep[[0, 2, 3, 4, 5]].any()
    assert (out.sampled[0] == -1).all() and (out.confidence[0] == -math.inf).all()
    with pytest.raises(ValueError, match="row 0: status 1"):
        ops.raise_on_status(out.status)


def test_argument_errors():
    logits = torch.zeros(2, 3, 11)
    tokens = torch.full((2, 3), MASK)
    with pytest.raises(ValueError, match=r"logits must be a tensor of shape \[batch, width, vocab\]"):
        ops.diffusion_unmask(logits[0], tokens, MASK)
    with pytest.raises(ValueError, match=r"tokens must have shape \[2, 3\]"):
        ops.diffusion_unmask(logits, tokens[:, :2], MASK)
    with pytest.raises(TypeError, match="tokens must hold integers"):
        ops.diffusion_unmask(logits, tokens.float(), MASK)
    with pytest.raises(ValueError, match=r"step must be in \[0, 2\^24\)"):
        ops.diffusion_unmask(logits, tokens, MASK, step=2**24)
    with pytest.raises(ValueError, match=r"num_transfer must be a scalar or have shape \[2\]"):
        ops.diffusion_unmask(logits, tokens, MASK, num_transfer=torch.ones(3, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="top_k must have shape"):
        torch.ops.specdec.diffusion_unmask(
            logits, tokens, MASK, torch.zeros(2), torch.zeros(3, dtype=torch.int32), torch.ones(2),
            torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64),
            torch.zeros(2, dtype=torch.int64), torch.ones(2, dtype=torch.int64), torch.zeros(2),
            torch.empty(2, 3, dtype=torch.int64), torch.empty(2, 3), torch.empty(2, 3, dtype=torch.bool),
            torch.empty(2, dtype=torch.int32))


def test_sampled_distribution_chi_square():
    """Tokens of a temperature-1 row follow softmax(logits): chi-square over 6000 independent draws
    (every (position, step) has its own Philox stream), fixed seed so the test is deterministic."""
    from scipy.stats import chisquare

    probs = torch.tensor([0.05, 0.1, 0.15, 0.3, 0.4, 0.0])
    logits = probs.clamp_min(1e-30).log()
    logits[5] = -math.inf
    width, draws = 600, 10
    counts = torch.zeros(6)
    for step in range(draws):
        out = ops.diffusion_unmask(logits.expand(1, width, 6), torch.full((1, width), 99), 99,
                                   temperature=1.0, seed=123, position=40, step=step, num_transfer=0)
        counts += torch.bincount(out.sampled.flatten(), minlength=6).float()
    assert counts[5] == 0
    _, p_value = chisquare(counts[:5].numpy(), (probs[:5] * width * draws).numpy())
    assert p_value > 1e-3, (counts, p_value)
    # the confidence is the drawn token's probability
    out = ops.diffusion_unmask(logits.expand(1, 8, 6), torch.full((1, 8), 99), 99, temperature=1.0, seed=1)
    torch.testing.assert_close(out.confidence[0], probs[out.sampled[0]])


def test_rows_independent_of_batch_and_order():
    case = make_case(6, 10, 111, seed=12)
    full = ops.diffusion_unmask(**case)
    perm = torch.tensor([3, 0, 5, 1, 4, 2])
    permuted = {k: (v[perm] if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    out = ops.diffusion_unmask(**permuted)
    assert torch.equal(out.sampled, full.sampled[perm]) and torch.equal(out.keep, full.keep[perm])
    single = {k: (v[2:3] if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    assert torch.equal(ops.diffusion_unmask(**single).sampled, full.sampled[2:3])


def test_fresh_draws_per_step():
    logits = torch.zeros(1, 64, 50)
    tokens = torch.full((1, 64), MASK)
    a = ops.diffusion_unmask(logits, tokens, MASK, temperature=1.0, step=0).sampled
    b = ops.diffusion_unmask(logits, tokens, MASK, temperature=1.0, step=1).sampled
    assert not torch.equal(a, b)
    assert Purpose.DIFFUSION == 6


# ---- registration: opcheck, torch.compile, CUDA ------------------------------------------------------

def _raw_args(case):
    B, W = case["tokens"].shape
    i64 = lambda v: v.to(torch.int64)  # noqa: E731
    return (case["logits"], case["tokens"], case["mask_id"], case["temperature"], case["top_k"],
            case["top_p"], i64(case["seed"]), i64(case["position"]), i64(case["step"]),
            i64(case["num_transfer"]), case["threshold"], torch.empty(B, W, dtype=torch.int64),
            torch.empty(B, W), torch.empty(B, W, dtype=torch.bool), torch.empty(B, dtype=torch.int32))


def test_opcheck_diffusion_unmask():
    torch.library.opcheck(torch.ops.specdec.diffusion_unmask.default, _raw_args(make_case(3, 6, 64, seed=4)))


def test_torch_compile_fullgraph():
    case = make_case(3, 6, 64, seed=8)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def step(logits, tokens, temperature, seed, step, num_transfer):
        out = ops.diffusion_unmask(logits, tokens, MASK, temperature, seed=seed, step=step,
                                   num_transfer=num_transfer)
        return torch.where(out.keep, out.sampled, tokens)

    args = (case["logits"], case["tokens"], case["temperature"], case["seed"], case["step"], case["num_transfer"])
    eager = ops.diffusion_unmask(case["logits"], case["tokens"], MASK, case["temperature"], seed=case["seed"],
                                 step=case["step"], num_transfer=case["num_transfer"])
    assert torch.equal(step(*args), torch.where(eager.keep, eager.sampled, case["tokens"]))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not specdec_cuda.build_info()["with_cuda"], reason="built without CUDA kernels")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,width,vocab", [(7, 13, 111), (3, 32, 2049), (2, 4, 32000)])
def test_cuda_equals_cpu(batch, width, vocab, dtype):
    case = make_case(batch, width, vocab, seed=batch + width + vocab, dtype=dtype)
    cpu = ops.diffusion_unmask(**case)
    cuda = ops.diffusion_unmask(**{k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()})
    assert torch.equal(cuda.status.cpu(), cpu.status)
    assert torch.equal(cuda.sampled.cpu(), cpu.sampled)
    assert torch.equal(cuda.keep.cpu(), cpu.keep)
    torch.testing.assert_close(cuda.confidence.cpu(), cpu.confidence, rtol=2e-5, atol=1e-7)
    if vocab < 10000:
        assert_matches_reference(case, device="cuda")


# ---- the model ----------------------------------------------------------------------------------------

def tiny_model(seed=0, dtype=torch.float32, vocab=41, layers=2):
    torch.manual_seed(seed)
    cfg = DiffusionConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_layers=layers,
                          num_heads=4, num_kv_heads=2, mask_token_id=vocab - 1, eos_token_id=0, max_position=256)
    model = DiffusionLM(cfg)
    with torch.no_grad():  # larger weights than the init: peaked, prompt-dependent distributions
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model.to(dtype).eval().requires_grad_(False)


def test_model_is_bidirectional_and_never_predicts_mask():
    model = tiny_model()
    x = torch.tensor([[3, 4, 5, 40, 40, 6]])
    a = model(x).logits
    y = x.clone()
    y[0, 5] = 9
    b = model(y).logits
    assert not torch.allclose(a[0, 0], b[0, 0]), "position 0 must see position 5"
    assert bool((a[..., 40] == -math.inf).all())


@pytest.mark.parametrize("mode", ["prefix", "dual"])
def test_cached_forward_equals_full_forward(mode):
    """With K/V cached from the same sequence, a cached forward gives the full forward's logits."""
    model = tiny_model(dtype=torch.float64)
    x = torch.randint(0, 40, (2, 20))
    valid = torch.ones(2, 20, dtype=torch.bool)
    valid[1, :3] = False
    pos = (torch.arange(20)[None] - torch.tensor([[0], [3]])).clamp(min=0)
    full = model(x, pos, valid, return_kv=True)
    s, e = 8, 12
    if mode == "prefix":
        past = [(k[:, :, :s], v[:, :, :s]) for k, v in full.kv]
        out = model(x[:, s:], pos[:, s:], valid[:, s:], past=past, past_valid=valid[:, :s]).logits
        torch.testing.assert_close(out, full.logits[:, s:])
    else:
        past = [(torch.cat((k[:, :, :s], k[:, :, e:]), 2), torch.cat((v[:, :, :s], v[:, :, e:]), 2)) for k, v in full.kv]
        pv = torch.cat((valid[:, :s], valid[:, e:]), 1)
        out = model(x[:, s:e], pos[:, s:e], valid[:, s:e], past=past, past_valid=pv).logits
        torch.testing.assert_close(out, full.logits[:, s:e])


def test_save_load_roundtrip_and_non_diffusion_checkpoint(tmp_path):
    model = tiny_model()
    model.save(tmp_path / "dlm")
    loaded = load_diffusion(tmp_path / "dlm")
    x = torch.randint(0, 40, (1, 9))
    torch.testing.assert_close(loaded(x).logits, model(x).logits)
    ar = tmp_path / "ar"
    ar.mkdir()
    (ar / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(UnsupportedModelError, match="'llama' checkpoint \\(LlamaForCausalLM\\), not a masked-diffusion LM"):
        load_diffusion(ar)
    with pytest.raises(UnsupportedModelError, match="not a masked-diffusion LM"):
        make_diffusion(str(ar))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_diffusion(tmp_path / "nothing")


# ---- generation -----------------------------------------------------------------------------------------

def reference_generate(model, prompt, gen_length, block_length, steps, params_row):
    """LLaDA's loop spelled out with the reference op and full forwards, one prompt."""
    temperature, top_k, top_p, seed = params_row
    mask = model.mask_token_id
    x = torch.tensor([list(prompt) + [mask] * gen_length])
    P, taken = len(prompt), 0
    for blk in range(gen_length // block_length):
        s, e = P + blk * block_length, P + (blk + 1) * block_length
        for n in transfer_schedule(block_length, steps):
            logits = model(x).logits[:, s:e]
            sampled, _, keep, status = ref.diffusion_unmask(
                logits, x[:, s:e], mask, torch.tensor([temperature]), torch.tensor([top_k]),
                torch.tensor([top_p]), torch.tensor([seed]), torch.tensor([P + blk * block_length]),
                torch.tensor([taken]), torch.tensor([n]), torch.tensor([0.0]))
            assert status.tolist() == [0]
            x[:, s:e] = torch.where(keep, sampled, x[:, s:e])
            taken += 1
    return x[0, P:].tolist()


@pytest.mark.parametrize("temperature,top_k,top_p,steps", [(0.0, 0, 1.0, 8), (1.0, 0, 1.0, 4), (0.8, 5, 0.9, 3)])
def test_generator_matches_reference_loop(temperature, top_k, top_p, steps):
    model = tiny_model(seed=1)
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12]]
    params = SamplingParams.make(2, temperature=temperature, top_k=top_k, top_p=top_p, seed=[11, 12])
    gen = DiffusionGenerator(model, gen_length=16, block_length=8, steps=steps)
    out = gen.generate(prompts, params, max_new_tokens=16)
    for b, p in enumerate(prompts):
        assert out.tokens[b] == reference_generate(model, p, 16, 8, steps, (temperature, top_k, top_p, 11 + b))
    assert out.metrics.target_forwards == 2 * steps
    assert out.metrics.unmasked == 2 * 16
    assert out.metrics.unmasked_per_forward == pytest.approx(8 / steps)


def test_generator_batch_independence_with_padding():
    model = tiny_model(seed=2, dtype=torch.float64)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14], [20, 21]]
    params = SamplingParams.make(3, temperature=0.9, seed=[1, 2, 3])
    gen = DiffusionGenerator(model, gen_length=12, block_length=4, steps=2)
    together = gen.generate(prompts, params, max_new_tokens=12).tokens
    for b, p in enumerate(prompts):
        alone = gen.generate([p], SamplingParams.make(1, temperature=0.9, seed=b + 1), max_new_tokens=12).tokens[0]
        assert alone == together[b]


def test_threshold_rule_forward_counts():
    model = tiny_model(seed=3)
    prompts = [[5, 6, 7, 8]]
    every = DiffusionGenerator(model, gen_length=16, block_length=8, threshold=1e-9).generate(prompts, max_new_tokens=16)
    assert every.metrics.target_forwards == 2  # every position passes: one step per block
    one = DiffusionGenerator(model, gen_length=16, block_length=8, threshold=1.0).generate(prompts, max_new_tokens=16)
    greedy_one = DiffusionGenerator(model, gen_length=16, block_length=8, steps=8).generate(prompts, max_new_tokens=16)
    # threshold 1 is never reached (probabilities < 1), so exactly the top-1 rule
    assert one.tokens == greedy_one.tokens and one.metrics.target_forwards == 16
    mid = DiffusionGenerator(model, gen_length=16, block_length=8, threshold=0.5).generate(prompts, max_new_tokens=16)
    assert 2 <= mid.metrics.target_forwards <= 16 and len(mid.tokens[0]) == 16


@pytest.mark.parametrize("mode", ["prefix", "dual", True])
def test_cache_modes(mode):
    model = tiny_model(seed=4)
    prompts = [[5, 6, 7, 8], [1, 2]]
    gen = DiffusionGenerator(model, gen_length=16, block_length=4, steps=2, use_cache=mode)
    out = gen.generate(prompts, max_new_tokens=16)
    assert out.metrics.target_forwards == 8 and out.metrics.full_forwards == 4
    assert all(len(t) == 16 and all(0 <= x < 40 for x in t) for t in out.tokens)
    # one step per block: only full forwards, so the cache changes nothing
    exact = DiffusionGenerator(model, gen_length=16, block_length=4, steps=1)
    cached = DiffusionGenerator(model, gen_length=16, block_length=4, steps=1, use_cache=mode)
    assert exact.generate(prompts, max_new_tokens=16).tokens == cached.generate(prompts, max_new_tokens=16).tokens


class ScriptedModel:
    """A stand-in diffusion LM whose greedy prediction at generated position j is script[j]."""

    def __init__(self, script, prompt_len, vocab=12):
        self.script, self.prompt_len = script, prompt_len
        self.mask_token_id, self.vocab_size, self.device = vocab - 1, vocab, torch.device("cpu")
        self.config = DiffusionConfig(vocab_size=vocab, hidden_size=8, intermediate_size=8, num_layers=1,
                                      num_heads=1, num_kv_heads=1, mask_token_id=vocab - 1, eos_token_id=0)
        self.calls = 0

    def __call__(self, tokens, positions=None, valid=None, past=None, past_valid=None, return_kv=False):
        self.calls += 1
        B, n = tokens.shape
        logits = torch.zeros(B, n, self.vocab_size)
        for i in range(n):
            j = int(positions[0, i]) - self.prompt_len
            if 0 <= j < len(self.script):
                logits[:, i, self.script[j]] = 5.0 + j % 3
        logits[..., self.mask_token_id] = -math.inf
        return type("Out", (), {"logits": logits, "kv": None})()


def test_eos_cuts_text_and_stops_generation():
    script = [3, 4, 5, 6, 0, 7, 8, 9] + [1] * 24
    model = ScriptedModel(script, prompt_len=2)
    streamed = []
    gen = DiffusionGenerator(model, gen_length=32, block_length=8, steps=8)
    out = gen.generate([[2, 3]], max_new_tokens=32, eos_token_id=0, stream=lambda b, t: streamed.append((b, t)))
    assert out.tokens == [[3, 4, 5, 6, 0]]
    assert streamed == [(0, [3, 4, 5, 6, 0])]
    assert model.calls == 8, "blocks after the EOS block are not generated"
    out = DiffusionGenerator(model, gen_length=32, block_length=8, steps=8).generate([[2, 3]], max_new_tokens=3)
    assert out.tokens == [[3, 4, 5]]


def test_generator_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match="gen_length must be a positive multiple of block_length 8"):
        DiffusionGenerator(model, gen_length=20, block_length=8)
    with pytest.raises(ValueError, match=r"steps \(per block\) must be an integer in \[1, block_length 8\]"):
        DiffusionGenerator(model, gen_length=16, block_length=8, steps=9)
    with pytest.raises(ValueError, match=r"threshold must be None or in \(0, 1\]"):
        DiffusionGenerator(model, gen_length=16, block_length=8, threshold=1.5)
    with pytest.raises(ValueError, match="use_cache must be"):
        DiffusionGenerator(model, gen_length=16, block_length=8, use_cache="suffix")
    with pytest.raises(TypeError, match="needs a masked-diffusion LM"):
        DiffusionGenerator(torch.nn.Linear(2, 2))
    gen = DiffusionGenerator(model, gen_length=16, block_length=8)
    with pytest.raises(ValueError, match="mask token 40"):
        gen.generate([[1, 40]])
    with pytest.raises(ValueError, match="max_new_tokens 17 exceeds gen_length 16"):
        gen.generate([[1, 2]], max_new_tokens=17)
    with pytest.raises(ValueError, match="non-empty"):
        gen.generate([[]])
    with pytest.raises(RuntimeError, match="status 3, bad sampling parameters"):
        gen.generate([[1, 2]], SamplingParams.make(1, temperature=-1.0))
    with pytest.raises(ValueError, match="unknown diffusion options"):
        make_diffusion(model, blocks=3)
    assert set(DIFFUSION_OPTIONS) == {"gen_length", "block_length", "steps", "threshold", "use_cache"}
    # gen_length derived from max_new_tokens, rounded up to a block
    out = DiffusionGenerator(model, block_length=8, threshold=0.3).generate([[1, 2]], max_new_tokens=10)
    assert len(out.tokens[0]) == 10


# ---- the zoo model (a tiny spec that trains in seconds) ------------------------------------------------

def test_zoo_diffusion_tiny_spec_trains_and_generates(tmp_path):
    from zoo import diffusion as zoo_diffusion
    from zoo.pairs import stdlib_corpus

    spec = zoo_diffusion.DiffusionSpec(name="tiny-diffusion", seq_len=32, batch_size=4, num_layers=1,
                                       hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1,
                                       steps=12, lr=3e-3, corpus_chars=60000, vocab_size=300, eval_tokens=512)
    lines = []
    folder = zoo_diffusion.get_diffusion(spec, log=lines.append, root=tmp_path)
    assert any("ETA" in line for line in lines) and (folder / "report.json").is_file()
    model, tokenizer = zoo_diffusion.load_zoo_diffusion(spec, root=tmp_path)
    assert model.mask_token_id == len(tokenizer) - 1 == 300
    assert tokenizer.convert_ids_to_tokens(model.mask_token_id) == "<|mdm_mask|>"
    report = json.loads((folder / "report.json").read_text())
    assert math.isfinite(report["eval_loss_bound"])
    prompt = tokenizer("def main(")["input_ids"]
    out = make_diffusion(str(folder), gen_length=16, block_length=8, threshold=0.9, use_cache="dual").generate(
        [prompt], max_new_tokens=16, eos_token_id=model.config.eos_token_id)
    assert 1 <= len(out.tokens[0]) <= 16
    assert stdlib_corpus  # the corpus function is the zoo's own
