"""Proposers that exist only to drive the loop's tree path through the conformance suite.

* ``ChainAsTree``: any chain proposer's drafts sent as explicit trees (parent of node j = node j-1),
  so the tree path (build_tree, tree-masked forward, verify_tree, compacting commit) must give
  exactly the chain path's tokens.
* ``GuessTree``: deterministic guesses as a real tree: a model's greedy chain, with a random sibling
  beside every chain node (put first at random, so the verifier must try the second child).
* ``SampledTree``: SpecInfer-style trees of fixed branching whose children are drawn i.i.d. from
  a q that the proposer states (a fixed distribution per depth): lossless whatever q is; cut to
  the depth a row is granted.

A speculation policy that exists for the same suite:

* ``VaryingPolicy``: grants the adaptable rows (``plan``'s ``adaptable``) a plain step, lengths
  drawn at random in 0 .. their limits, or their limits, at random per step, and the others their
  limit: a method whose sampled rows are adaptable must emit the same samples under it as
  autoregressive decoding.

And one deliberately broken proposer, the mutant the deep chi-square must catch:

* ``DeepOffByOne``: a SAMPLED chain proposer whose draft logits are shifted by one position from
  depth 2 on (node j >= 1 claims the q of node j - 1), so rejection sampling is wrong only at
  draft depth >= 2. NOT lossless; never register it.
"""

from __future__ import annotations

import torch

from specdec_cuda import ops
from specdec_cuda.proposers.base import Draft, DraftKind, Proposer
from specdec_cuda.reference.philox import Purpose


class Wrapped(Proposer):
    """A proposer that rewrites ``inner``'s drafts: the draft it hands the loop carries the
    original in ``context``, which goes back to ``inner`` on accept."""

    def __init__(self, inner: Proposer) -> None:
        self.inner = inner
        self.max_draft = inner.max_draft
        self.hidden_layers = inner.hidden_layers

    def max_pending_tokens(self) -> int:
        return self.inner.max_pending_tokens()

    def prefill(self, ctx) -> None:
        self.inner.prefill(ctx)

    def accept(self, draft, outcome) -> None:
        self.inner.accept(None if draft is None else draft.context, outcome)


class ChainAsTree(Wrapped):
    def propose(self, state):
        draft = self.inner.propose(state)
        if draft is None:
            return None
        B, n = draft.tokens.shape
        parents = torch.arange(n, device=draft.tokens.device).expand(B, n).contiguous()
        return Draft(draft.tokens, draft.num_nodes, draft.kind, parents=parents, logits=draft.logits,
                     context=draft)


class GuessTree(Proposer):
    """Deterministic guesses as a real tree: ``model``'s greedy chain of ``depth`` tokens (recomputed
    from the committed text each step, without a cache: tiny test models only), with a random
    sibling beside every chain node, put first at random so the verifier must try the second child.
    """

    def __init__(self, model, depth: int, seed: int = 0) -> None:
        self.model, self.max_draft = model, depth
        self.generator = torch.Generator().manual_seed(seed)

    def max_pending_tokens(self) -> int:
        return 2 * self.max_draft

    def prefill(self, ctx) -> None:
        self.seq = [ctx.prompts[b, : int(n)].tolist() + [int(t)]
                    for b, (n, t) in enumerate(zip(ctx.prompt_lens.tolist(), ctx.first_tokens.tolist()))]

    def _greedy_chains(self, seqs: list[list[int]], depths: list[int]) -> list[list[int]]:
        """Each row's greedy chain of ``depths[b]`` tokens after ``seqs[b]``: per chain token one
        forward over all rows, right-padded, without a cache (the prefixes are short), reading each
        row's logits at its last real token."""
        chains = [[] for _ in seqs]
        for j in range(max(depths, default=0)):
            rows = [b for b, d in enumerate(depths) if d > j]
            texts = [seqs[b] + chains[b] for b in rows]
            width = max(len(t) for t in texts)
            tokens = torch.zeros(len(rows), width, dtype=torch.int64)
            for i, t in enumerate(texts):
                tokens[i, : len(t)] = torch.tensor(t)
            cache = self.model.new_cache(len(rows), width + 1)
            device = self.model.device
            last = torch.tensor([len(t) - 1 for t in texts], device=device)
            logits = self.model.forward(tokens.to(device), torch.arange(width, device=device).expand(len(rows), width),
                                        cache, logits_at=last).logits[:, 0]
            for b, token in zip(rows, logits.argmax(-1).tolist()):
                chains[b].append(token)
        return chains

    def propose(self, state):
        limits = torch.where(state.active, state.max_draft, 0).tolist()
        k = max(limits)
        if k == 0:
            return None
        B = len(limits)
        tokens = torch.zeros(B, 2 * k, dtype=torch.int64)
        parents = torch.zeros(B, 2 * k, dtype=torch.int64)
        vocab = self.model.vocab_size
        for b, chain in enumerate(self._greedy_chains(self.seq, limits)):
            parent = 0
            for j, token in enumerate(chain):
                # Depth j + 1 holds two nodes (slots 2j, 2j + 1): the chain token and a guess.
                first = bool(torch.rand((), generator=self.generator) < 0.5)
                c, s = (2 * j + 1, 2 * j) if first else (2 * j, 2 * j + 1)
                tokens[b, c], tokens[b, s] = token, int(torch.randint(vocab, (), generator=self.generator))
                parents[b, c] = parents[b, s] = parent
                parent = c + 1
        num_nodes = torch.tensor([2 * d for d in limits])
        device = state.lengths.device
        return Draft(tokens.to(device), num_nodes.to(device), DraftKind.GUESS, parents=parents.to(device))

    def accept(self, draft, outcome) -> None:
        counts, tokens = outcome.num_accepted.tolist(), outcome.tokens.tolist()
        for b, active in enumerate(outcome.active.tolist()):
            if active:
                self.seq[b].extend(tokens[b][: counts[b] + 1])


class SampledTree(Proposer):
    """Trees of ``branching[d]`` children per node at depth ``d``, drawn i.i.d. from q_d.

    q_d is a fixed random distribution per depth (the verifier is told it), so the draft is a true
    SpecInfer draft; acceptance is low but not zero on a small vocabulary. A row granted fewer
    than ``len(branching)`` draft tokens sends the tree cut to that depth (in BFS order the nodes
    of depth <= d are a prefix).
    """

    def __init__(self, vocab: int, branching=(2, 2), seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.q_logits = [2 * torch.randn(vocab, generator=g, dtype=torch.float64) for _ in branching]
        self.branching = branching
        self.max_draft = len(branching)
        # BFS layout of the full tree: node index (1-based, root 0) of every draft node's parent.
        parents, level = [], [0]
        for width in branching:
            nxt = []
            for p in level:
                for _ in range(width):
                    parents.append(p)
                    nxt.append(len(parents))
            level = nxt
        self.parents = torch.tensor(parents, dtype=torch.int64)
        depth = []
        for p in parents:
            depth.append(0 if p == 0 else depth[p - 1] + 1)
        self.depth = torch.tensor(depth)

    def max_pending_tokens(self) -> int:
        return len(self.parents)

    def propose(self, state):
        B, n, device = state.lengths.shape[0], len(self.parents), state.lengths.device
        V = self.q_logits[0].shape[0]
        logits = torch.stack([self.q_logits[d] for d in self.depth.tolist()])  # [n, V]
        logits = logits.to(device)[None].expand(B, n, V).contiguous()
        p = state.params
        tokens = torch.empty(B, n, dtype=torch.int64, device=device)
        for j in range(n):
            # Each child an independent draw: keyed by its depth's position and its sibling index.
            draw = ops.sample(logits[:, j], temperature=p.temperature.clamp(min=1e-3), top_k=p.top_k,
                              top_p=p.top_p, seed=p.seed, position=state.lengths + 1 + int(self.depth[j]),
                              purpose=Purpose.DRAFT, substream=j)
            tokens[:, j] = draw.tokens.clamp(min=0)
        # A row granted depth d sends the nodes of depth <= d (a prefix of the BFS layout).
        nodes_within = torch.tensor([int((self.depth < d).sum()) for d in range(self.max_draft + 1)],
                                    device=device)
        num_nodes = nodes_within[torch.where(state.active, state.max_draft, 0).clamp(max=self.max_draft)]
        parents = self.parents.to(device)[None].expand(B, n).contiguous()
        return Draft(tokens, num_nodes, DraftKind.SAMPLED, parents=parents, logits=logits)

    def accept(self, draft, outcome) -> None:
        pass


class DeepOffByOne(Wrapped):
    """MUTANT (test-only, not lossless): ``inner``'s SAMPLED chains with the draft logits of node
    ``j >= 1`` replaced by those of node ``j - 1``, the off-by-one of pairing a drafter's logits
    with the wrong token. Depth 1 is verified against the true q, so every run that drafts one
    token deep (three-token runs) is exactly ``inner``'s; from depth 2 on the verifier accepts
    with min(1, p / q') for a q' the token was not drawn from, and the output is biased."""

    def propose(self, state):
        draft = self.inner.propose(state)
        if draft is None:
            return None
        if draft.kind is not DraftKind.SAMPLED or not draft.is_chain:
            raise ValueError("DeepOffByOne mutates SAMPLED chains (run it at temperature > 0)")
        logits = draft.logits.clone()
        logits[:, 1:] = draft.logits[:, :-1]
        return Draft(draft.tokens, draft.num_nodes, draft.kind, logits=logits, context=draft)


class VaryingPolicy:
    """Random draft lengths for adaptable rows, full limits for the others (module docstring)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = torch.Generator().manual_seed(seed)

    def start(self, batch: int) -> None:
        pass

    def plan(self, active, limits, adaptable, remaining=None):
        # 1 step in 8 plain, 3 in 8 random lengths, half full length (the suite's deep checks need
        # runs of accepted drafts).
        roll = int(torch.randint(0, 8, (1,), generator=self.rng))
        if roll == 0:
            return [0 if ad else lim for ad, lim in zip(adaptable, limits)]
        if roll >= 4:
            return list(limits)
        return [int(torch.randint(0, lim + 1, (1,), generator=self.rng)) if ad else lim
                for ad, lim in zip(adaptable, limits)]

    def observe(self, active, drafted, accepted, fed_width, seconds) -> None:
        pass


# -- method="cross_tokenizer": tokenizers and a drafter of another vocabulary for any small target ------

_CROSS: dict = {}  # id(target) -> (target, the options without k), built once per target


def train_bpe(alphabet: str, vocab_size: int, seed: int):
    """A character BPE (no pre-tokenizer, so a text is one word; the decoder joins the pieces)
    trained to ``vocab_size`` on random strings over ``alphabet``: a tokenizer whose pieces
    straddle each other's boundaries, as real subword vocabularies do."""
    import random

    from tokenizers import Tokenizer, decoders, models, trainers

    rng = random.Random(seed)
    corpus = ["".join(rng.choice(alphabet) for _ in range(rng.randint(8, 40))) for _ in range(400)]
    tok = Tokenizer(models.BPE())
    tok.decoder = decoders.Fuse()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=list(alphabet),
                                                        limit_alphabet=len(alphabet), show_progress=False))
    if tok.get_vocab_size() != vocab_size:
        raise AssertionError(f"trained {tok.get_vocab_size()} tokens, wanted {vocab_size}")
    return tok


def coarser_bpe(tok, keep_merges: int):
    """Another tokenizer from the BPE ``tok``: its first ``keep_merges`` merges only, ids numbered
    in reverse. Its pieces are the target's or smaller, so a drafter token often ends inside a
    target token (the boundary problem) while the two agree on much of the text."""
    import json

    from tokenizers import Tokenizer, decoders, models

    model = json.loads(tok.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]][:keep_merges]
    pieces = sorted(model["vocab"], key=model["vocab"].get)
    pieces = [p for p in pieces if len(p) == 1] + ["".join(m) for m in merges]
    out = Tokenizer(models.BPE(vocab={p: len(pieces) - 1 - i for i, p in enumerate(pieces)}, merges=merges))
    out.decoder = decoders.Fuse()
    return out


def write_bigram_drafter(folder, sequences, vocab: int) -> None:
    """A Llama checkpoint that is a bigram model of ``sequences`` (lists of token ids < ``vocab``):
    one layer whose attention and MLP write nothing (o_proj, down_proj zero), one-hot embeddings,
    so the final norm gives sqrt(H) e_i and the LM head's column i holds log-counts of what follows
    token i (scaled by 1 / sqrt(H)). Greedy, it proposes each token's most frequent successor."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden = 4 * ((vocab + 3) // 4)  # H >= vocab, two heads of an even size
    counts = torch.full((vocab, vocab), 0.1, dtype=torch.float64)  # [previous, next]
    for seq in sequences:
        for a, b in zip(seq, seq[1:]):
            counts[a, b] += 1
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for norm in (model.model.norm, model.model.layers[0].input_layernorm,
                     model.model.layers[0].post_attention_layernorm):
            norm.weight.fill_(1.0)
        model.model.embed_tokens.weight[:, :vocab] = torch.eye(vocab)
        head = torch.zeros(vocab, hidden, dtype=torch.float64)
        head[:, :vocab] = counts.log().T / hidden ** 0.5  # head[next, previous]
        model.lm_head.weight.copy_(head)
    model.save_pretrained(folder)


def cross_tokenizer_options(target) -> dict:
    """``method="cross_tokenizer"`` options for a small random ``target`` (vocabulary 6 .. 64): a BPE
    target tokenizer of exactly its vocabulary, a BPE drafter tokenizer over the same letters with
    other merges, and a bigram drafter fitted to the target's own greedy and sampled text (drafter
    tokens), so drafts are accepted often, whole runs of them included."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    import specdec_cuda
    from specdec_cuda import models

    key = id(target)
    if key in _CROSS and _CROSS[key][0] is target:
        return dict(_CROSS[key][1])
    V = target.vocab_size
    alphabet = "abcdefgh"[: max(2, min(8, V // 2))]
    target_tok = train_bpe(alphabet, V, seed=11)
    draft_tok = coarser_bpe(target_tok, keep_merges=max(1, 2 * (V - len(alphabet)) // 3))
    # The target's text: greedy from every one-token prompt and a few longer ones, and samples at
    # the conformance suite's temperature, decoded and re-encoded in the drafter's vocabulary.
    prompts = [[t] for t in range(V)] + [[1, 2, 3], [5 % V, 6 % V, 7 % V, 8 % V], [4 % V, 1]]
    texts = []
    for kw in (dict(), dict(temperature=0.9, top_k=5, top_p=0.95, seed=list(range(len(prompts))))):
        out = specdec_cuda.generate(target, prompts, max_new_tokens=32, **kw)
        texts += [target_tok.decode(p + o) for p, o in zip(prompts, out.tokens)]
    folder = Path(tempfile.mkdtemp(prefix="cross-drafter-"))
    atexit.register(shutil.rmtree, folder, True)
    write_bigram_drafter(folder, [draft_tok.encode(t).ids for t in texts], draft_tok.get_vocab_size())
    draft_tok.save(str(folder / "tokenizer.json"))
    drafter = models.load(folder, dtype=target.dtype, device=target.device)
    _CROSS[key] = (target, dict(draft=drafter, draft_tokenizer=folder, target_tokenizer=target_tok))
    return dict(_CROSS[key][1])
