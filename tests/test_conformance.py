"""The conformance suite: the gate every decoding method passes before it ships.

Every method in the registry (``specdec_cuda.methods``) runs here, on the built-in model and on a
``transformers`` model behind ``HFCausalLM``, through:

* greedy output equal to autoregressive greedy output, token for token (fp64, a ragged batch of
  prompts of different lengths);
* a chi-square test of the joint distribution of the first three sampled tokens against the
  exactly computed target distribution, with temperature, top-k and top-p;
* chi-square tests of late tokens (the marginals of tokens 3 .. 6, the joints of tokens 3, 4 and
  of tokens 5, 6) of six-token runs, where drafts reach depth 3 and are accepted at depth >= 2
  (asserted from the run's metrics); a mutant that is wrong only from draft depth 2 on
  (``DeepOffByOne``) must fail them while passing the first-tokens test;
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
from _eagle3_testlib import trained_drafter
from _models_testlib import random_exit_adapter
from conformance_proposers import (ChainAsTree, DeepOffByOne, GuessTree, SampledTree, VaryingPolicy,
                                   cross_tokenizer_options)
from decoding_models import load_backend, make_checkpoint
from lossless_stats import chi2_pvalue, exact_joint, exact_sequences, project
from specdec_cuda import methods
from specdec_cuda.decoding import SamplingParams, decode
from specdec_cuda.models.heads import random_heads
from specdec_cuda.proposers.draft_model import DraftModelProposer

PROMPTS = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [4], [11, 12], [30, 31, 32, 33], [7]]
SMALL_VOCAB, CHI_PROMPT, CHI_SAMPLES = 6, [1, 2, 3], 2000
CHI_TEMPERATURE, CHI_TOP_K, CHI_TOP_P = 0.9, 5, 0.95
CHI_ALPHA = 1e-3


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
    # The case whose samples this one reproduces exactly, seed for seed, at temperature > 0 (None:
    # its own). Sample-and-match verification emits the autoregressive samples of the same seed
    # (decoding.py, "Randomness"); a chain sent as a tree gives the chain's tokens; the cost policy
    # grants rows sampled by rejection their full limit (policy.py), so it drafts as the fixed one
    # does. The deep test checks that equality and leaves the chi-square to the case named here.
    # Cases that shorten drafts at random (VaryingPolicy) show that matching rows do not depend on
    # their draft lengths.
    same_samples_as: str | None = None
    # False: the cost policy may rightly decode this case plainly on the suite's tiny models, so the
    # deep test does not require it to accept deep drafts (its samples are still compared).
    must_draft_deep: bool = True

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


AR = "autoregressive"  # the case sample-and-match methods reproduce sample for sample (same_samples_as)

CASES = [
    Case("autoregressive", True, method="autoregressive", options=lambda env: {}),
    Case("draft", True, method="draft",
         options=lambda env: dict(draft=env.draft, k=3, verification="rejection", policy="fixed")),
    # The defaults: coupled drafts under the cost policy, the autoregressive samples.
    Case("draft-cost-policy", True, method="draft", options=lambda env: dict(draft=env.draft, k=3),
         same_samples_as=AR, must_draft_deep=False),
    # A draft vocabulary without every fourth id: the target's tokens outside it have q = 0 and
    # come only from the residual distribution, which verification must still get right.
    Case("draft-vocab", True, method="draft",
         options=lambda env: dict(draft=_builtin_target(env.draft, "draft_vocab"), k=3, policy="fixed",
                                  verification="rejection", draft_vocab=_without_every_fourth(env.target))),
    # The drafter reads the last 3 prompt tokens only (the suite's prompts are 1 to 7 long).
    Case("draft-context", True, method="draft",
         options=lambda env: dict(draft=env.draft, k=3, policy="fixed", draft_context=3)),
    Case("draft-match", True, method="draft",
         options=lambda env: dict(draft=env.draft, k=3, verification="match", policy="fixed"), same_samples_as=AR),
    # Drafts drawn with the target's own sampling noise: the autoregressive samples, whatever the lengths.
    Case("draft-coupled", True, method="draft",
         options=lambda env: dict(draft=env.draft, k=3, verification="coupled", policy=VaryingPolicy()),
         same_samples_as=AR),
    Case("prompt-lookup", True, method="prompt_lookup", options=lambda env: dict(k=3, policy="fixed"), same_samples_as=AR),
    Case("prompt-lookup-tree", True, method="prompt_lookup",
         options=lambda env: dict(k=3, num_candidates=3, n_min=1, n_max=3, policy="fixed"), same_samples_as=AR),
    Case("ngram", True, method="ngram", options=lambda env: dict(k=3, num_candidates=2, policy="fixed"), same_samples_as=AR),
    Case("lookahead", True, method="lookahead", options=lambda env: dict(window=3, ngram=3, num_guesses=3, policy="fixed"),
         same_samples_as=AR),
    Case("lookahead-varying-k", True, method="lookahead",
         options=lambda env: dict(window=3, ngram=3, num_guesses=3, policy=VaryingPolicy()), same_samples_as=AR),
    Case("lookahead-no-window", True, method="lookahead",
         options=lambda env: dict(window=0, ngram=4, num_guesses=2, own_candidates=2, policy="fixed"),
         same_samples_as=AR),
    Case("lookahead+draft", True, method="lookahead+draft",
         options=lambda env: dict(draft=env.draft, k=3, window=3, ngram=3, num_guesses=2, policy="fixed"),
         same_samples_as=AR),
    Case("medusa-chain", True, method="medusa",
         options=lambda env: dict(heads=random_heads(env.target, "medusa", 3, seed=5), policy="fixed"),
         same_samples_as=AR),
    Case("medusa-tree", True, method="medusa",
         options=lambda env: dict(heads=random_heads(env.target, "medusa", 3, seed=5), budget=12, policy="fixed"),
         same_samples_as=AR),
    Case("mtp", True, method="mtp",
         options=lambda env: dict(heads=random_heads(env.target, "mtp", 2, seed=6), k=3, policy="fixed",
                                  verification="rejection")),
    Case("mtp-coupled", True, method="mtp",
         options=lambda env: dict(heads=random_heads(env.target, "mtp", 2, seed=6), k=3, policy=VaryingPolicy()),
         same_samples_as=AR),
    # Heads drafting over a draft vocabulary (FR-Spec) without every fourth id (q = 0 there).
    Case("medusa-vocab", True, method="medusa",
         options=lambda env: dict(heads=random_heads(env.target, "medusa", 3, seed=5), policy="fixed",
                                  tree=[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)],
                                  draft_vocab=_without_every_fourth(env.target)), same_samples_as=AR),
    Case("mtp-vocab", True, method="mtp",
         options=lambda env: dict(heads=random_heads(env.target, "mtp", 2, seed=6), k=3, policy="fixed",
                                  verification="rejection", draft_vocab=_without_every_fourth(env.target))),
    Case("chain-as-tree", True,
         proposer=lambda env: ChainAsTree(DraftModelProposer(env.draft, k=3, verification="rejection")),
         same_samples_as="draft"),
    Case("guess-tree", True, proposer=lambda env: GuessTree(env.draft, depth=3), same_samples_as=AR),
    Case("sampled-tree", True, proposer=lambda env: SampledTree(env.target.vocab_size, branching=(2, 2, 1))),
    Case("dflash", True, method="dflash",
         options=lambda env: dict(drafter=random_dflash_drafter(env.target), block_size=4, policy="fixed",
                                  draft_sampling="sampled")),
    Case("dflash-greedy-draft", True, method="dflash",
         options=lambda env: dict(drafter=random_dflash_drafter(env.target), block_size=4,
                                  draft_sampling="greedy", policy="fixed"), same_samples_as=AR),
    Case("dflash-coupled", True, method="dflash",
         options=lambda env: dict(drafter=random_dflash_drafter(env.target), block_size=4,
                                  draft_sampling="coupled", policy=VaryingPolicy()), same_samples_as=AR),
    Case("ddtree", True, method="ddtree",
         options=lambda env: dict(drafter=random_dflash_drafter(env.target), budget=6, block_size=4,
                                  policy="fixed"), same_samples_as=AR),
    # A draft vocabulary (FR-Spec) without every fourth id: those tokens have q = 0 in the sampled
    # drafts and come from the residual only; DDTree's trees never hold them.
    Case("dflash-vocab", True, method="dflash",
         options=lambda env: dict(drafter=random_dflash_drafter(env.target), block_size=4, policy="fixed",
                                  draft_sampling="sampled", draft_vocab=_without_every_fourth(env.target))),
    Case("ddtree-vocab", True, method="ddtree",
         options=lambda env: dict(drafter=random_dflash_drafter(env.target), budget=6, block_size=4, policy="fixed",
                                  draft_vocab=_without_every_fourth(env.target)), same_samples_as=AR),
    # EAGLE-3 drafters fitted for a few dozen steps to each target's own text (_eagle3_testlib), so
    # that deep drafts are accepted.
    Case("eagle3-chain", True, method="eagle3",
         options=lambda env: dict(drafter=trained_drafter(env.target), tree=False, k=3, policy=VaryingPolicy()),
         same_samples_as=AR),
    # A draft vocabulary without the target text's rarest ids: their q is 0, they come from the residual only.
    Case("eagle3-rejection", True, method="eagle3",
         options=lambda env: dict(drafter=trained_drafter(env.target, reduced_vocab=True), tree=False, k=3,
                                  verification="rejection", policy="fixed")),
    Case("eagle3-tree", True, method="eagle3",
         options=lambda env: dict(drafter=trained_drafter(env.target), depth=3, topk=3, budget=10, policy="fixed"),
         same_samples_as=AR),
    Case("quantspec", True, method="quantspec",
         options=lambda env: dict(k=3, group_size=32, policy="fixed", verification="rejection"),
         target=lambda env: _quantized_target(env.target)),
    Case("quantspec-coupled", True, method="quantspec", options=lambda env: dict(k=3, group_size=32,
                                                                                 policy=VaryingPolicy()),
         target=lambda env: _quantized_target(env.target), same_samples_as=AR),
    Case("cross-tokenizer", True, method="cross_tokenizer",
         options=lambda env: dict(cross_tokenizer_options(env.target), k=3, policy="fixed"), same_samples_as=AR),
    Case("mtp-native", True, method="mtp", options=lambda env: dict(k=3, policy="fixed"),
         target=lambda env: _mimo_target(env.target)),
    # The MTP layers of DeepSeek-V3, GLM-4.5 and Qwen3-Next checkpoints, on transformers' blocks
    # (the hf env only); coupled drafts: the autoregressive samples.
    *[Case(f"mtp-native-{layout}", True, method="mtp", options=lambda env: dict(k=3, policy="fixed"),
           target=lambda env, layout=layout: _hf_mtp_target(env.target, layout), same_samples_as=AR)
      for layout in ("deepseek_v3", "glm4_moe", "qwen3_next")],
    # Layer 0 left out: the small target has one layer, so its draft is the head over the embeddings.
    Case("layer-skip", True, method="layer_skip",
         options=lambda env: dict(k=3, skip=[0], policy="fixed", verification="rejection"),
         target=lambda env: _builtin_target(env.target, "layer_skip")),
    Case("layer-skip-cost-policy", True, method="layer_skip", options=lambda env: dict(k=3, skip=[0]),
         target=lambda env: _builtin_target(env.target, "layer_skip"), same_samples_as=AR, must_draft_deep=False),
    Case("layer-skip-calibrated", True, method="layer_skip", options=lambda env: dict(k=3, policy="fixed"),
         target=lambda env: _builtin_target(env.target, "layer_skip")),
    # The draft's head over the first half of the vocabulary: q is zero elsewhere, still lossless.
    Case("layer-skip-draft-vocab", True, method="layer_skip",
         options=lambda env: dict(k=3, skip=[0], policy="fixed", verification="rejection",
                                  draft_vocab=env.target.vocab_size // 2),
         target=lambda env: _builtin_target(env.target, "layer_skip")),
    # A random exit adapter (Kangaroo) after the first layer, with its own draft vocabulary (every
    # fourth id left out); its K/V of committed positions come from the verifications' stream.
    Case("layer-skip-adapter", True, method="layer_skip",
         options=lambda env: dict(k=3, adapter=random_exit_adapter(env.target, ids=_without_every_fourth(env.target)), policy="fixed",
                                  verification="rejection"),
         target=lambda env: _builtin_target(env.target, "layer_skip")),
    Case("layer-skip-adapter-coupled", True, method="layer_skip",
         options=lambda env: dict(k=3, adapter=random_exit_adapter(env.target, ids=_without_every_fourth(env.target)), policy=VaryingPolicy()),
         target=lambda env: _builtin_target(env.target, "layer_skip"), same_samples_as=AR),
]


_MIMO: dict = {}  # source folder -> its MiMo-layout copy (native MTP layers), written once per session


def _mimo_target(model):
    """The env's target with MTP layers in its checkpoint (MiMo layout), loaded as the built-in model:
    ``method="mtp"`` with no heads runs the checkpoint's own layers."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    from _models_testlib import write_mimo_checkpoint
    from specdec_cuda import models

    model = _builtin_target(model, "native MTP")
    source = model.checkpoint_dir
    if source not in _MIMO:
        folder = Path(tempfile.mkdtemp(prefix="mimo-"))
        atexit.register(shutil.rmtree, folder, True)
        _MIMO[source] = write_mimo_checkpoint(source, folder, num_mtp=2, seed=7)
    return models.load(_MIMO[source], dtype=model.dtype)


_HF_MTP: dict = {}  # (layout, vocab) -> its target, written and loaded once per session


def _hf_mtp_target(model, layout: str):
    """A checkpoint of ``layout`` with MTP layers and the env target's vocabulary (2 main layers, 2
    MTP layers; GLM-4.5: 1), loaded by transformers behind ``HFCausalLM``: ``method="mtp"`` with no
    heads runs the checkpoint's own layers."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    from _models_testlib import load_hf_mtp_target, write_hf_mtp_checkpoint
    from specdec_cuda.models import HFCausalLM

    if not isinstance(model, HFCausalLM):
        pytest.skip(f"{layout} MTP layers run on the transformers adapter: the case runs in the hf env")
    key = (layout, model.vocab_size)
    if key not in _HF_MTP:
        folder = Path(tempfile.mkdtemp(prefix=f"{layout}-"))
        atexit.register(shutil.rmtree, folder, True)
        write_hf_mtp_checkpoint(layout, folder, num_mtp=1 if layout == "glm4_moe" else 2, seed=7,
                                vocab_size=model.vocab_size)
        _HF_MTP[key] = load_hf_mtp_target(folder)
    return _HF_MTP[key]


def _builtin_target(model, method: str):
    from specdec_cuda.models import LlamaModel

    if not isinstance(model, LlamaModel):
        pytest.skip(f"{method} runs a subset of the built-in model's layers or LM head; the transformers adapter has "
                    f"no such forward")
    return model


def _quantized_target(model):
    """The target on the hierarchical int4 KV cache, with groups small enough that the suite's short
    runs quantise and slide (key groups of 4 tokens, the last 4 tokens in full precision)."""
    from specdec_cuda.models import LlamaModel, QuantKVModel

    if not isinstance(model, LlamaModel):
        pytest.skip("quantspec runs the built-in model over its own quantised KV cache; the transformers "
                    "adapter's DynamicCache has none")
    return QuantKVModel(model, key_group=4, residual=4)

IDS = [c.name for c in CASES]


def _without_every_fourth(model) -> list[int]:
    return [i for i in range(model.vocab_size) if i % 4 != 1]


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


LOSSLESS = [c for c in CASES if c.lossless]


@dataclass
class Sampled:
    """A method's runs: their tokens in seed order, the sequences counted (tuple -> count), and the
    runs' draft counts per draft position summed (``Metrics.drafted`` / ``Metrics.accepted``: entry
    j counts the row-steps that drafted / accepted j + 1 or more draft tokens)."""

    rows: list
    counts: dict
    drafted: list
    accepted: list

    def accepted_at(self, depth: int) -> float:
        """Row-steps that accepted ``depth`` or more draft tokens, per run."""
        return (self.accepted[depth - 1] if len(self.accepted) >= depth else 0) / len(self.rows)


def sample_runs(case, env, new_tokens, samples, first_seed, batch) -> Sampled:
    """``samples`` runs of ``CHI_PROMPT`` (seeds ``first_seed ..``), ``batch`` rows per decode call."""
    result = Sampled([], {}, [], [])

    def add(total, more):
        total.extend([0] * (len(more) - len(total)))
        for j, value in enumerate(more):
            total[j] += value

    for start in range(0, samples, batch):
        rows = min(batch, samples - start)
        out = case.run(env, [CHI_PROMPT] * rows, new_tokens, temperature=CHI_TEMPERATURE, top_k=CHI_TOP_K,
                       top_p=CHI_TOP_P, seed=list(range(first_seed + start, first_seed + start + rows)))
        result.rows.extend(out.tokens)
        for row in out.tokens:
            result.counts[tuple(row)] = result.counts.get(tuple(row), 0) + 1
        add(result.drafted, out.metrics.drafted)
        add(result.accepted, out.metrics.accepted)
    return result


def shallow_pvalue(case, env) -> float:
    """The first-tokens check: p-value of the joint of three-token runs. A three-token run drafts
    at most one token deep (the loop drafts the remaining budget minus the bonus token: 2 - 1)."""
    sampled = sample_runs(case, env, 3, CHI_SAMPLES, 0, 500)
    joint = exact_joint(env.target, CHI_PROMPT, SMALL_VOCAB, CHI_TEMPERATURE, CHI_TOP_K, CHI_TOP_P)
    return chi2_pvalue(sampled.counts, joint, CHI_SAMPLES)


@pytest.mark.parametrize("case", LOSSLESS, ids=[c.name for c in LOSSLESS])
def test_first_three_sampled_tokens_have_the_target_distribution(envs, case):
    env = case.env(envs["small"])
    assert shallow_pvalue(case, env) > CHI_ALPHA


# -- deep drafts: late tokens of six-token runs -------------------------------------------------------
#
# In a six-token run the first decoding step may draft 3 deep (budget 5 less the bonus token), so
# tokens 2 .. 4 can come from one chain / tree and tokens 3 .. 6 are judged at depths 1 .. 3. Each
# method's runs are checked against the exact distribution of the six tokens (every prefix of
# nonzero probability enumerated on the six-token vocabulary) by DEEP_CHECKS: the marginals of
# tokens 3, 4, 5, 6 and the joints of tokens (3, 4) and (5, 6).
#
# Error rates. Each check fails at p < DEEP_ALPHA = 1e-5; the suite makes 6 checks per method and
# backend, about 20 methods x 2 backends: by the union bound a lossless suite fails with probability
# < 240 * 1e-5 = 0.24% for a fresh choice of seeds (the seeds are fixed, so a given tree of code
# passes or fails deterministically; a library change that moves the random streams re-draws).
# Power: a marginal (5 degrees of freedom, 1e-5 point 30.9) fails with probability 0.95 once its
# chi-square divergence from the target reaches 47 / DEEP_SAMPLES (noncentrality 47): 0.0047 at
# 10^4 runs, e.g. 0.027 of probability moved between two tokens of probability ~0.3. The mutant
# (DeepOffByOne: draft logits off by one position from depth 2 on, which moves ~0.05 of a token's
# probability) fails x3 and x4 at p ~ 1e-46 while its first-tokens p-value is 0.26; its x5 and x6
# alone (p ~ 3e-3) would not catch it, which is why tokens 3 and 4 are checked too.

DEEP_TOKENS, DEEP_SAMPLES, DEEP_BATCH, DEEP_FIRST_SEED = 6, 10_000, 2_500, 1_000_000
DEEP_ALPHA = 1e-5
DEEP_CHECKS = {"x3": (2,), "x4": (3,), "x5": (4,), "x6": (5,), "x3,x4": (2, 3), "x5,x6": (4, 5)}
# Cases with ``same_samples_as`` run DEEP_EQUAL_ROWS six-token runs and must give the named case's
# tokens on every one: stronger than a chi-square of their own (a bug that changes one run in a
# few hundred fails it) and a tenth of the cost.
DEEP_EQUAL_ROWS = 1_000
# A method's six-token runs must accept 2 or more drafts in one step on at least this share of the
# runs, so that the deep checks really judge deep acceptances (measured: 6% .. 99%).
DEEP_MIN_ACCEPTED_AT_2 = 0.02
CASE_BY_NAME = {c.name: c for c in CASES}
_EXACT: dict = {}


def exact_six(model) -> dict:
    """P(x1 .. x6 | CHI_PROMPT) under ``model`` (computed once per model object)."""
    if id(model) not in _EXACT or _EXACT[id(model)][0] is not model:
        _EXACT[id(model)] = (model, exact_sequences(model, CHI_PROMPT, SMALL_VOCAB, DEEP_TOKENS, CHI_TEMPERATURE,
                                                    CHI_TOP_K, CHI_TOP_P))
    return _EXACT[id(model)][1]


@dataclass
class DeepCheck:
    pvalues: dict  # DEEP_CHECKS name -> p-value
    sampled: Sampled

    @property
    def failed(self) -> list[str]:
        return [name for name, p in self.pvalues.items() if not p > DEEP_ALPHA]


def deep_check(case, env) -> DeepCheck:
    """The late-token checks of ``case`` on ``env``: DEEP_SAMPLES six-token runs against the exact
    distribution of six tokens."""
    sampled = sample_runs(case, env, DEEP_TOKENS, DEEP_SAMPLES, DEEP_FIRST_SEED, DEEP_BATCH)
    exact = exact_six(env.target)
    pvalues = {name: chi2_pvalue(project(sampled.counts, idx), project(exact, idx), DEEP_SAMPLES)
               for name, idx in DEEP_CHECKS.items()}
    return DeepCheck(pvalues, sampled)


def _assert_deep_drafts_accepted(case, sampled):
    assert sampled.accepted_at(2) >= DEEP_MIN_ACCEPTED_AT_2, (
        f"{case.name}: 2 or more drafts accepted in a step on {sampled.accepted_at(2):.1%} of the runs (per "
        f"position: drafted {sampled.drafted}, accepted {sampled.accepted}); the deep checks would not see deep drafts")


@pytest.mark.parametrize("case", LOSSLESS, ids=[c.name for c in LOSSLESS])
def test_late_sampled_tokens_of_deep_drafts_have_the_target_distribution(envs, case):
    env = case.env(envs["small"])
    if case.same_samples_as is not None:
        sampled = sample_runs(case, env, DEEP_TOKENS, DEEP_EQUAL_ROWS, DEEP_FIRST_SEED, DEEP_EQUAL_ROWS)
        reference = sample_runs(CASE_BY_NAME[case.same_samples_as], env, DEEP_TOKENS, DEEP_EQUAL_ROWS,
                                DEEP_FIRST_SEED, DEEP_EQUAL_ROWS)
        differ = [i for i, (a, b) in enumerate(zip(sampled.rows, reference.rows)) if a != b]
        assert not differ, (f"{len(differ)} of {DEEP_EQUAL_ROWS} six-token runs differ from {case.same_samples_as}'s "
                            f"of the same seed, e.g. seed {DEEP_FIRST_SEED + differ[0]}: {sampled.rows[differ[0]]} "
                            f"vs {reference.rows[differ[0]]}")
        if case.must_draft_deep:
            _assert_deep_drafts_accepted(case, sampled)
        return
    check = deep_check(case, env)
    if case.name != AR:
        _assert_deep_drafts_accepted(case, check.sampled)
    assert not check.failed, f"{case.name}: late tokens off the target distribution: p-values {check.pvalues}"


def test_deep_check_catches_what_the_first_tokens_check_cannot(folders):
    """A proposer wrong only from draft depth 2 on (DeepOffByOne) passes the first-tokens check and
    fails the deep one: the deep check adds coverage the first-tokens check cannot have."""
    env = Env(load_backend(folders["small"][0], "builtin"), load_backend(folders["small"][1], "builtin"))
    mutant = Case("deep-off-by-one", False,
                  proposer=lambda env: DeepOffByOne(DraftModelProposer(env.draft, k=3, verification="rejection")))
    assert shallow_pvalue(mutant, env) > CHI_ALPHA
    check = deep_check(mutant, env)
    _assert_deep_drafts_accepted(mutant, check.sampled)
    assert check.failed, f"the deep checks missed wrong draft logits at depth >= 2: p-values {check.pvalues}"


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
        chain = decode(env.target, PROMPTS, params, 20, proposer=DraftModelProposer(env.draft, k=3, verification="rejection"))
        tree = decode(env.target, PROMPTS, params, 20,
                      proposer=ChainAsTree(DraftModelProposer(env.draft, k=3, verification="rejection")))
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
