"""The conformance suite: the gate every decoding method passes before it ships.

Every method in the registry (``specdec_cuda.methods``) runs here, on the built-in model and on a
``transformers`` model behind ``HFCausalLM``, through:

* greedy output equal to autoregressive greedy output, token for token (fp64, a ragged batch of
  prompts of different lengths);
* a chi-square test of the joint distribution of the first three sampled tokens against the
  exactly computed target distribution, with temperature, top-k and top-p;
* EOS inside an accepted run, and ``max_new_tokens`` budgets cut inside one;
* a row's output independent of its batch neighbours and of its place in the batch (same seed);
* streaming callbacks that see exactly the final tokens.

A method joins by being registered: ``CASES`` says how the suite builds each one (the options it
needs, e.g. a drafter), and ``test_every_registered_method_is_in_the_suite`` fails for a
registered method the suite does not run. Test-only proposers drive the loop's tree path the same
way (``conformance_proposers.py``). Lossy methods run the structural checks only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import specdec_cuda
from conformance_proposers import ChainAsTree, GuessTree, SampledTree
from decoding_models import load_backend, make_checkpoint
from lossless_stats import chi2_pvalue, exact_joint
from specdec_cuda import methods
from specdec_cuda.decoding import SamplingParams, decode
from specdec_cuda.models.heads import random_heads
from specdec_cuda.proposers.draft_model import DraftModelProposer

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [11, 12], [30, 31, 32, 33], [7]]
SMALL_VOCAB, CHI_PROMPT, CHI_SAMPLES = 6, [1, 2, 3], 2000
CHI_TEMPERATURE, CHI_TOP_K, CHI_TOP_P = 0.9, 5, 0.95


@dataclass
class Env:
    """A target, a perturbed drafter of it, and the target itself as a perfect drafter."""

    target: object
    draft: object


@dataclass
class Case:
    """How the suite runs one method: a registered name with options, or a test-only proposer."""

    name: str
    lossless: bool
    method: str | None = None
    options: Callable[[Env], dict] | None = None
    proposer: Callable[[Env], object] | None = None
    # The target this method runs on and the autoregressive baseline it must equal (None: the
    # env's own). QuantSpec verifies on the hierarchical 4-bit KV cache, so its baseline is the
    # same model decoding autoregressively on that cache (models.QuantKVModel), not the plain one.
    target: Callable[[Env], object] | None = None

    def env(self, env: Env) -> Env:
        return env if self.target is None else Env(self.target(env), env.draft)

    def run(self, env: Env, prompts, max_new_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=0,
            eos_token_id=None, stream=None):
        if self.method is not None:
            return specdec_cuda.generate(env.target, prompts, method=self.method, max_new_tokens=max_new_tokens,
                                         temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                                         eos_token_id=eos_token_id, stream=stream, **self.options(env))
        params = SamplingParams.make(len(prompts), temperature, top_k, top_p, seed, env.target.device)
        eos = [] if eos_token_id is None else [eos_token_id]
        return decode(env.target, prompts, params, max_new_tokens, proposer=self.proposer(env),
                      eos_token_id=eos, stream=stream)


CASES = [
    Case("autoregressive", True, method="autoregressive", options=lambda env: {}),
    Case("draft", True, method="draft", options=lambda env: dict(draft=env.draft, k=3, policy="fixed")),
    Case("draft-cost-policy", True, method="draft", options=lambda env: dict(draft=env.draft, k=3)),
    Case("draft-match", True, method="draft",
         options=lambda env: dict(draft=env.draft, k=3, verification="match", policy="fixed")),
    Case("prompt-lookup", True, method="prompt_lookup", options=lambda env: dict(k=3)),
    Case("prompt-lookup-tree", True, method="prompt_lookup",
         options=lambda env: dict(k=3, num_candidates=3, n_min=1, n_max=3)),
    Case("ngram", True, method="ngram", options=lambda env: dict(k=3, num_candidates=2)),
    Case("lookahead", True, method="lookahead", options=lambda env: dict(window=3, ngram=3, num_guesses=3)),
    Case("lookahead-no-window", True, method="lookahead",
         options=lambda env: dict(window=0, ngram=4, num_guesses=2, own_candidates=2)),
    Case("lookahead+draft", True, method="lookahead+draft",
         options=lambda env: dict(draft=env.draft, k=3, window=3, ngram=3, num_guesses=2)),
    Case("medusa-chain", True, method="medusa",
         options=lambda env: dict(heads=random_heads(env.target, "medusa", 3, seed=5), policy="fixed")),
    Case("medusa-tree", True, method="medusa",
         options=lambda env: dict(heads=random_heads(env.target, "medusa", 3, seed=5), budget=12, policy="fixed")),
    Case("mtp", True, method="mtp",
         options=lambda env: dict(heads=random_heads(env.target, "mtp", 2, seed=6), k=3, policy="fixed")),
    Case("chain-as-tree", True, proposer=lambda env: ChainAsTree(DraftModelProposer(env.draft, k=3))),
    Case("guess-tree", True, proposer=lambda env: GuessTree(env.draft, depth=3)),
    Case("sampled-tree", True, proposer=lambda env: SampledTree(env.target.vocab_size, branching=(2, 2))),
    Case("dflash", True, method="dflash",
         options=lambda env: dict(drafter=random_dflash_drafter(env.target), block_size=4, policy="fixed")),
    Case("dflash-greedy-draft", True, method="dflash",
         options=lambda env: dict(drafter=random_dflash_drafter(env.target), block_size=4,
                                  draft_sampling="greedy", policy="fixed")),
    Case("ddtree", True, method="ddtree",
         options=lambda env: dict(drafter=random_dflash_drafter(env.target), budget=6, block_size=4,
                                  policy="fixed")),
    Case("quantspec", True, method="quantspec", options=lambda env: dict(k=3, group_size=32, policy="fixed"),
         target=lambda env: _quantized_target(env.target)),
]


def _quantized_target(model):
    """The target on the hierarchical int4 KV cache, with groups small enough that the suite's short
    runs quantise and slide (key groups of 4 tokens, the last 4 tokens in full precision)."""
    from specdec_cuda.models import LlamaModel, QuantKVModel

    if not isinstance(model, LlamaModel):
        pytest.skip("quantspec runs the built-in model over its own quantised KV cache; the transformers "
                    "adapter's DynamicCache has none")
    return QuantKVModel(model, key_group=4, residual=4)

IDS = [c.name for c in CASES]


def random_dflash_drafter(target):
    """A randomly initialised DFlash drafter shaped after ``target`` (structure, not quality)."""
    from specdec_cuda.models.dflash import DFlashConfig, DFlashDrafter

    return DFlashDrafter.random(DFlashConfig.for_target(target, block_size=4), seed=0)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("conformance")
    target = make_checkpoint(root / "target", seed=0)
    draft = make_checkpoint(root / "draft", perturb_from=target, noise=0.05, seed=1)
    small = make_checkpoint(root / "small", vocab=SMALL_VOCAB, hidden=16, layers=1, heads=2, kv_heads=1, seed=3)
    small_draft = make_checkpoint(root / "small_draft", perturb_from=small, noise=0.5, seed=4)
    return dict(big=(target, draft), small=(small, small_draft))


@pytest.fixture(scope="module", params=["builtin", "hf"])
def envs(request, folders):
    def env(kind):
        target, draft = folders[kind]
        return Env(load_backend(target, request.param), load_backend(draft, request.param))

    return dict(big=env("big"), small=env("small"))


def _ar(env, prompts, n, **kw):
    return specdec_cuda.generate(env.target, prompts, max_new_tokens=n, **kw)


def test_every_registered_method_is_in_the_suite():
    covered = {c.method for c in CASES if c.method is not None}
    missing = [m.name for m in methods.available() if m.name not in covered and m.kind != "generation"]
    assert not missing, f"registered methods the conformance suite does not run: {missing}"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_greedy_equals_autoregressive(envs, case):
    env = case.env(envs["big"])
    out = case.run(env, PROMPTS, 24)
    assert out.tokens == _ar(env, PROMPTS, 24).tokens
    if case.name != "autoregressive":
        assert 0.0 < out.metrics.acceptance_rate  # the drafts were really verified, some accepted


@pytest.mark.parametrize("case", [c for c in CASES if c.lossless], ids=[c.name for c in CASES if c.lossless])
def test_first_three_sampled_tokens_have_the_target_distribution(envs, case):
    env = case.env(envs["small"])
    counts: dict = {}
    batch = 500
    for start in range(0, CHI_SAMPLES, batch):
        out = case.run(env, [CHI_PROMPT] * batch, 3, temperature=CHI_TEMPERATURE, top_k=CHI_TOP_K,
                       top_p=CHI_TOP_P, seed=list(range(start, start + batch)))
        for row in out.tokens:
            counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    joint = exact_joint(env.target, CHI_PROMPT, SMALL_VOCAB, CHI_TEMPERATURE, CHI_TOP_K, CHI_TOP_P)
    assert chi2_pvalue(counts, joint, CHI_SAMPLES) > 1e-3


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_eos_inside_an_accepted_run(envs, case):
    env = case.env(envs["big"])
    perfect = Env(env.target, env.target)  # a drafter equal to the target accepts whole runs
    ar = _ar(env, PROMPTS[:2], 20).tokens
    # An EOS id that first appears at index >= 2 of row 0, so a run accepted from index 1 holds it.
    index = next(i for i in range(2, 8) if ar[0][i] not in ar[0][:i])
    eos = ar[0][index]
    out = case.run(perfect, PROMPTS[:2], 20, eos_token_id=eos)
    assert out.tokens == _ar(env, PROMPTS[:2], 20, eos_token_id=eos).tokens
    assert out.tokens[0][-1] == eos and len(out.tokens[0]) == index + 1


@pytest.mark.parametrize("max_new_tokens", [1, 2, 5])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_budget_cut_inside_an_accepted_run(envs, case, max_new_tokens):
    env = case.env(envs["big"])
    perfect = Env(env.target, env.target)
    out = case.run(perfect, PROMPTS[:3], max_new_tokens)
    assert [len(t) for t in out.tokens] == [max_new_tokens] * 3
    assert out.tokens == _ar(env, PROMPTS[:3], max_new_tokens).tokens


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_rows_independent_of_neighbours_and_place(envs, case):
    env = case.env(envs["big"])
    kw = dict(temperature=1.0, top_p=0.9)
    alone = case.run(env, [PROMPTS[1]], 12, seed=7, **kw).tokens[0]
    batch = case.run(env, [PROMPTS[3], PROMPTS[0], PROMPTS[1]], 12, seed=[1, 2, 7], **kw).tokens
    other = case.run(env, [PROMPTS[1], PROMPTS[4]], 12, seed=[7, 3], **kw).tokens
    assert batch[2] == alone and other[0] == alone


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_stream_sees_exactly_the_final_tokens(envs, case):
    env = case.env(envs["big"])
    streamed = [[] for _ in PROMPTS]
    ar = _ar(env, PROMPTS, 16).tokens
    eos = ar[2][5]
    out = case.run(env, PROMPTS, 16, temperature=0.0, eos_token_id=eos,
                   stream=lambda row, toks: streamed[row].extend(toks))
    assert streamed == out.tokens


def test_chain_through_the_tree_path_gives_the_chain_path_tokens(folders):
    env = Env(load_backend(folders["big"][0], "builtin"), load_backend(folders["big"][1], "builtin"))
    for temperature, seed in ((0.0, 0), (1.0, 11), (0.7, 5)):
        params = SamplingParams.make(len(PROMPTS), temperature, 0, 1.0, seed)
        chain = decode(env.target, PROMPTS, params, 20, proposer=DraftModelProposer(env.draft, k=3))
        tree = decode(env.target, PROMPTS, params, 20, proposer=ChainAsTree(DraftModelProposer(env.draft, k=3)))
        assert tree.tokens == chain.tokens
        assert tree.metrics.drafted == chain.metrics.drafted
        assert tree.metrics.accepted == chain.metrics.accepted


# -- lossy generation modes: the structural checks ---------------------------------------------------

def _generation_model(name: str):
    """A small random model for each registered generation method (structure only, no quality)."""
    if name == "diffusion":
        from test_diffusion import tiny_model

        return tiny_model(seed=0)
    raise AssertionError(f"the conformance suite has no model for generation method {name!r}")


GENERATION = [m.name for m in methods.available() if m.kind == "generation"]


@pytest.mark.parametrize("name", GENERATION)
def test_generation_modes_are_labelled_lossy_and_keep_the_structure(name):
    spec = methods.get(name)
    assert not spec.lossless and "LOSSY" in spec.summary
    model = _generation_model(name)
    prompts = [[3, 4, 5], [6, 7], [8]]
    dec = specdec_cuda.SpeculativeDecoder(model, method=name)
    streamed = [[] for _ in prompts]
    out = dec.generate(prompts, max_new_tokens=12, temperature=1.0, seed=[1, 2, 3],
                       stream=lambda row, toks: streamed[row].extend(toks))
    assert all(0 < len(t) <= 12 for t in out.tokens)
    assert streamed == out.tokens
    # EOS ends a row: nothing after it.
    eos = out.tokens[0][len(out.tokens[0]) // 2]
    cut = dec.generate(prompts, max_new_tokens=12, temperature=1.0, seed=[1, 2, 3], eos_token_id=eos).tokens
    assert all(eos not in t[:-1] for t in cut)
    # A row's output does not depend on its neighbours or its place in the batch (same seed).
    alone = dec.generate([prompts[1]], max_new_tokens=12, temperature=1.0, seed=2).tokens[0]
    assert alone == out.tokens[1]
