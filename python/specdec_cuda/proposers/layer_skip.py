"""Layer-skip self-speculation (early exit / skipped layers; LayerSkip, Draft & Verify, SWIFT):
the target drafts with a subset of its own decoder layers and its own final norm and LM head.

No second model and no second tokenizer. A draft pass is ``target.forward(..., layers=run)``
(``LlamaModel.forward``'s ``layers`` extension): the residual stream passes the skipped layers
unchanged, the layers that run read the target's committed K/V (the prompt and every accepted
token, written by full verification forwards) and write their own K/V for the draft tokens to the
pending slots. Those slots are rolled back after the chain (``truncate``: lengths only) and
verification, the target's full forward, overwrites them, so the output is the target's.

The draft is sampled from the subset's own distribution q: with the target's own sampling noise and
matched (``verification="coupled"``, the default: the autoregressive samples exactly), or on the
draft stream and verified by rejection sampling (``"rejection"``, ``DraftKind.SAMPLED`` with q's
logits); at temperature 0 it is the subset's argmax, verified greedily.

Which layers run: ``exit_layer=L`` runs layers 0 .. L-1 (an early exit), ``skip=[...]`` runs all
but those; with neither, the choice is measured on the model at hand the first time the proposer
sees a prompt (``choose_layers``): layers ranked by their block influence (ShortGPT, Men et al.
2024: 1 - cos(input, output) of the residual stream over the prompt; the layers that change it
least are skipped first) and candidate skip sets and early exits scored by how often their argmax
agrees with the full model's over the prompt, against what each pass costs (weight bytes read,
the LM head included). The choice is then kept for the proposer's life, so every later request,
and a seeded sampled run repeated with the same proposer, drafts the same way.

Draft vocabulary (``draft_vocab=``, FR-Spec, as for ``method="draft"``): the draft passes run the
LM head over a subset of the vocabulary only (an int ``n``: ids ``0 .. n - 1``, or token ids);
every other token gets probability 0 in the draft, so it is never drafted but still emitted when the
target chooses it (lossless). The head is a large share of a small model's forward (Qwen2.5-1.5B:
15% of its weight bytes, so of every draft pass), and the calibration counts the subset's cost and
its agreement.

Exit adapter (``adapter=``, Kangaroo, ``models.exit_adapter``): a small network trained for this
target (``python -m specdec_cuda.train exit``) between its first ``exit_layer`` layers and its head,
which an early exit needs on a model whose head reads only the last layers' stream. The draft pass
is then ``forward(layers=range(exit_layer), before_head=adapter)`` over the adapter's draft
vocabulary. The adapter's own K/V of a committed position come from the stream the target's layers
made of it: the prompt's from the prefill, the accepted path's from each verification (the loop
hands the proposer that layer's hidden states), so its cache never holds a drafted position.

What it does not do: trees, and verification that reuses the draft's work. Only the layers
before the first skipped one see the inputs the full model sees; an early exit's draft K/V and
layer-L inputs for those layers are the target's own, and a verification could start at layer L
from them. The loop's verification is one full forward, and on the CPU the saving is small
(verification of k + 1 rows costs about 1.3 steps there), so it is left for later.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contract import (SAMPLED_VERIFICATION_OPTION, Draft, Outcome, PrefillContext, Proposer, StepState,
                        check_sampled_verification, sampled_draft_kind)
from ..methods import MethodSpec, register
from ..models.draft_vocab import VocabSubset
from ..models.llama import LlamaModel
from .self_chain import self_draft_chain

CALIBRATION_TOKENS = 64  # prompt tokens (row 0's last ones, plus its first sampled token) a choice is measured on
SKIP_FRACTIONS = (0.125, 0.25, 0.375, 0.5)  # candidate skip sets: this share of the layers, least influential first
EXIT_FRACTIONS = (0.5, 0.75, 0.875)  # candidate early exits: the first this share of the layers


@dataclass(frozen=True)
class LayerChoice:
    """One candidate draft path and what the calibration measured of it.

    ``layers``: decoder layers the draft runs (increasing); ``agreement``: the share of calibration
    positions where its argmax equals the full model's; ``cost``: its forward's weight bytes as a
    share of the full model's; ``speedup``: the estimate it was chosen by (see ``estimated_speedup``).
    """

    layers: tuple[int, ...]
    agreement: float
    cost: float
    speedup: float
    label: str


def estimated_speedup(agreement: float, cost: float, k: int) -> float:
    """Tokens per target-step equivalent of chains of ``k`` drafted at ``cost`` (a share of a step)
    each, if each draft token is accepted with probability ``agreement`` independently:
    E[tokens] = 1 + a + ... + a^k over k * cost + 1 (verification of k + 1 rows taken as one step,
    the memory-bound regime; where it costs more the ranking of candidates barely moves)."""
    a = min(max(agreement, 0.0), 1.0)
    tokens = k + 1.0 if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
    return tokens / (k * cost + 1.0)


def layer_cost_shares(model: LlamaModel) -> tuple[float, float]:
    """(one decoder layer's, the LM head's) weight bytes as shares of a full forward's: decoding is
    memory-bound, so a pass costs about the bytes it reads."""
    c = model.config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    head = c.vocab_size * c.hidden_size
    total = c.num_hidden_layers * layer + head
    return layer / total, head / total


def block_influence(model: LlamaModel, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(influence [N], full-model logits [1, n, V]) over ``tokens`` [1, n]: influence[i] is the mean
    over positions of 1 - cos(input of layer i, its output), from one full forward on a scratch cache."""
    n, num_layers = tokens.shape[1], model.num_layers
    positions = torch.arange(n, device=tokens.device)[None]
    out = model.forward(tokens, positions, model.new_cache(1, n), hidden_layers=tuple(range(num_layers)))
    stream = [model.embed(tokens).float()] + [out.hidden_states[i].float() for i in range(num_layers)]
    influence = torch.stack([
        1.0 - torch.nn.functional.cosine_similarity(stream[i], stream[i + 1], dim=-1).mean()
        for i in range(num_layers)
    ])
    return influence, out.logits


def candidate_paths(influence: torch.Tensor) -> list[tuple[str, tuple[int, ...]]]:
    """Labelled layer subsets to measure: skip sets of growing size (least influential first) and
    early exits, each leaving at least one layer skipped and, for N > 1, one run."""
    num_layers = influence.numel()
    order = [int(i) for i in torch.argsort(influence, stable=True)]  # least influential first
    seen, paths = set(), []

    def add(label: str, run: list[int]) -> None:
        key = tuple(sorted(run))
        if len(key) < num_layers and (key or num_layers == 1) and key not in seen:
            seen.add(key)
            paths.append((label, key))

    for share in SKIP_FRACTIONS:
        m = max(1, round(share * num_layers))
        add(f"skip {m} least influential", [i for i in range(num_layers) if i not in order[:m]])
    for share in EXIT_FRACTIONS:
        exit_layer = max(1, round(share * num_layers))
        add(f"exit after {exit_layer}", list(range(exit_layer)))
    return paths


def choose_layers(model: LlamaModel, tokens: torch.Tensor, k: int,
                  vocab: VocabSubset | None = None) -> tuple[LayerChoice, list[LayerChoice]]:
    """(the chosen draft path, every candidate measured) on calibration ``tokens`` [1, n]; see the
    module docstring. Costs one full forward and one subset forward per candidate, of n tokens each.
    ``vocab``: the draft passes' head runs over this subset (its cost and its argmax are measured)."""
    influence, full_logits = block_influence(model, tokens)
    reference = full_logits.argmax(-1)  # [1, n]
    layer_share, head_share = layer_cost_shares(model)
    if vocab is not None:
        head_share *= len(vocab) / model.vocab_size
    n = tokens.shape[1]
    positions = torch.arange(n, device=tokens.device)[None]
    measured = []
    for label, run in candidate_paths(influence):
        logits = model.forward(tokens, positions, model.new_cache(1, n), layers=run, vocab=vocab).logits
        guess = logits.argmax(-1) if vocab is None else vocab.ids.to(logits.device)[logits.argmax(-1)]
        agreement = float((guess == reference).float().mean())
        cost = len(run) * layer_share + head_share
        measured.append(LayerChoice(run, agreement, cost, estimated_speedup(agreement, cost, k), label))
    return max(measured, key=lambda c: c.speedup), measured


class LayerSkipProposer(Proposer):
    """Chains of ``k`` tokens from the target's own forward over a subset of its layers (see the
    module docstring); ``layers`` is the subset, set from the options or at the first prefill."""

    def __init__(self, target: LlamaModel, k: int = 4, skip=None, exit_layer: int | None = None,
                 verification: str = "coupled", draft_vocab=None, adapter=None) -> None:
        if not isinstance(target, LlamaModel):
            raise TypeError("method 'layer_skip' drafts through a subset of the target's decoder layers, which the "
                            "built-in model runs (models.load / models.load_gguf: LlamaModel.forward(layers=...)); "
                            f"got {type(target).__name__}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        num_layers = target.num_layers
        if skip is not None and exit_layer is not None:
            raise ValueError("give skip (layers to leave out) or exit_layer (run the first L layers), not both")
        self.target, self.k, self.max_draft = target, k, k
        self.verification = check_sampled_verification(verification)
        self.layers: tuple[int, ...] | None = None
        self.choice: LayerChoice | None = None  # what the calibration chose, when it did
        self.candidates: list[LayerChoice] = []
        self.adapter = None if adapter is None else load_adapter(target, adapter)
        self.hidden_layers: tuple[int, ...] = ()
        if self.adapter is not None:
            exit_at = self.adapter.config.exit_layer
            if skip is not None or exit_layer not in (None, exit_at):
                raise ValueError(f"the exit adapter was trained at exit_layer={exit_at}: give no skip, and exit_layer "
                                 f"only as {exit_at}")
            self.layers, exit_layer = tuple(range(exit_at)), None
            self.hidden_layers = (exit_at - 1,)  # its input: the stream the target's layers made
            if draft_vocab is None:
                draft_vocab = self.adapter.draft_ids
        # The draft passes' head over part of the vocabulary (made now: the model is as it will run).
        self.vocab = None if draft_vocab is None else target.vocab_subset(draft_vocab)
        if exit_layer is not None:
            if isinstance(exit_layer, bool) or not isinstance(exit_layer, int) or not 0 <= exit_layer < num_layers:
                raise ValueError(f"exit_layer must be an int in [0, {num_layers}) (the layers run before the "
                                 f"model's norm and head), got {exit_layer!r}")
            self.layers = tuple(range(exit_layer))
        elif skip is not None:
            left_out = {int(i) for i in skip}
            if not left_out or any(not 0 <= i < num_layers for i in left_out):
                raise ValueError(f"skip must name at least one layer, each in [0, {num_layers}), got {list(skip)!r}")
            self.layers = tuple(i for i in range(num_layers) if i not in left_out)

    def prefill(self, ctx: PrefillContext) -> None:
        self.cache, self.params = ctx.cache, ctx.params
        if self.layers is None:
            p = int(ctx.prompt_lens[0])
            row = torch.cat([ctx.prompts[0, :p], ctx.first_tokens[:1]])[-CALIBRATION_TOKENS:]
            self.choice, self.candidates = choose_layers(self.target, row[None], self.k, self.vocab)
            self.layers = self.choice.layers
        self.kind = sampled_draft_kind(self.verification, bool((ctx.params.temperature == 0).all()))
        if self.adapter is not None:
            # The adapter's K/V of the prompt, from the stream the prefill's layers made of it.
            B, P = ctx.prompts.shape
            self.adapter_cache = self.adapter.new_cache(B, ctx.max_length + self.k + 2)
            positions = torch.arange(P, device=ctx.prompts.device).expand(B, P)
            self.adapter.step(ctx.hidden_states[self.hidden_layers[0]], positions, self.adapter_cache,
                              num_new=ctx.prompt_lens)
            self.adapter_cache.commit(ctx.prompt_lens)

    def _draft_logits(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The draft pass's logits [B, V] (``MASKED`` outside a draft vocabulary)."""
        before_head = None
        if self.adapter is not None:  # the chain's j-th pass writes the adapter's scratch slot j
            offset, self.offset = self.offset, self.offset + 1

            def before_head(stream: torch.Tensor) -> torch.Tensor:
                return self.adapter.step(stream, positions, self.adapter_cache, offset=offset)

        out = self.target.forward(tokens, positions, self.cache, layers=self.layers, vocab=self.vocab,
                                  before_head=before_head).logits[:, 0]
        return out if self.vocab is None else self.vocab.expand(out)

    def propose(self, state: StepState) -> Draft | None:
        self.offset = 0
        return self_draft_chain(self._draft_logits, self.cache, state, self.params, self.k, self.kind,
                                coupled=self.verification == "coupled")

    def matches_samples(self) -> bool:
        return self.verification == "coupled"

    def accept(self, draft: Draft | None, outcome: Outcome) -> None:
        """The target's cache was committed by the loop. With an adapter, its K/V of the
        positions committed this step (the root and the accepted drafts), from the verification's
        stream at the exit layer; the scratch its draft passes wrote is left behind."""
        if self.adapter is None:
            return
        stream = outcome.hidden_states[self.hidden_layers[0]]  # [B, m, H], the root first
        kept = torch.where(outcome.active, outcome.num_accepted + 1, 0)
        positions = outcome.lengths[:, None] + torch.arange(stream.shape[1], device=stream.device)
        self.adapter.step(stream, positions, self.adapter_cache, num_new=kept)
        self.adapter_cache.commit(kept)


def load_adapter(target, adapter):
    """An ``ExitAdapter`` attached to ``target``: an adapter, its folder, or True for the drafter
    cache's (``python -m specdec_cuda.train exit`` writes it; FileNotFoundError naming that command
    when there is none)."""
    from pathlib import Path

    from ..models.exit_adapter import ExitAdapter

    if adapter is True:
        from ..drafters import cached_drafter

        adapter = cached_drafter(target, "exit")
    if isinstance(adapter, (str, Path)):
        adapter = ExitAdapter.load(adapter)
    if not isinstance(adapter, ExitAdapter):
        raise TypeError(f"adapter: expected an ExitAdapter, its folder or True (the drafter cache's), got "
                        f"{type(adapter).__name__}")
    return adapter.attach(target)


def make_layer_skip_proposer(target, k: int = 4, skip=None, exit_layer: int | None = None,
                             verification: str = "coupled", draft_vocab=None, adapter=None) -> LayerSkipProposer:
    """The ``method="layer_skip"`` proposer; ``target`` is a built-in ``models.LlamaModel``."""
    return LayerSkipProposer(target, k=k, skip=skip, exit_layer=exit_layer, verification=verification,
                             draft_vocab=draft_vocab, adapter=adapter)


register(MethodSpec(
    name="layer_skip",
    summary="self-speculation through a subset of the target's own layers and its head (early exit / "
            "skipped layers; no second model), the subset measured on the model or given",
    lossless=True,
    make=make_layer_skip_proposer,
    # A subset forward costs most of a full one on a memory-bound machine, so drafting pays only where
    # verification is cheap and agreement high: the measured costs decide, plain decoding included.
    options={
        "k": "draft tokens per step (default 4)",
        "skip": "decoder layers the draft leaves out (default: chosen at the first prompt by block influence "
                "and measured agreement against cost)",
        "exit_layer": "draft with the first L layers only (an early exit), instead of skip",
        "verification": SAMPLED_VERIFICATION_OPTION,
        "draft_vocab": "the draft passes' LM head over part of the vocabulary (FR-Spec, as for method draft): an "
                       "int n (ids 0 .. n-1) or token ids; lossless (default: the whole vocabulary, or the adapter's)",
        "adapter": "a trained exit adapter (Kangaroo) between the first exit_layer layers and the head: an "
                   "ExitAdapter, its folder, or True for the drafter cache's (`python -m specdec_cuda.train exit "
                   "--target DIR --data FILE` trains one); default none",
    },
))
