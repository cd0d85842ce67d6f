"""The configurations the end-to-end bench runs each registered method in.

The registry (``specdec_cuda.methods``) knows methods and their options; which settings the bench
compares, and where the bench pair keeps each method's trained parts, is the bench's business.
``CONFIGS[name](pair)`` gives ``(label, options)`` pairs for ``SpeculativeDecoder(target, name,
**options)``; ``pair`` is ``e2e.Pair`` (``target``, ``draft``, ``target_dir``, ``draft_dir``,
``tokenizer``). A generation method names the model it runs under the option ``"model"``. A
function raises ``FileNotFoundError`` naming what the pair lacks (a drafter, trained heads, a model
of its own); the bench then reports the method as not benched, with that reason. A registered
method missing here is reported as not benched, and ``tests/test_e2e.py`` fails.
"""

from __future__ import annotations

from pathlib import Path


def _drafter_dir(pair, kind: str) -> Path:
    """The ``kind`` drafter trained for the pair's target: beside its folder as the zoo keeps them
    (``heads-medusa``, ``heads-mtp``, ``dflash``, ``eagle3``), else the one the drafter cache holds for it
    (``python -m specdec_cuda.train KIND --target DIR`` writes there)."""
    from specdec_cuda import drafters

    folder = Path(pair.target_dir).parent / (kind if kind in ("dflash", "eagle3") else f"heads-{kind}")
    if (folder / "config.json").is_file():
        return folder
    cached = drafters.find(pair.target, kind)
    if cached is None:
        raise FileNotFoundError(f"no {kind} drafter for {pair.target_dir} (fingerprint "
                                f"{drafters.fingerprint(pair.target)}); train one with "
                                f"`python -m specdec_cuda.train {kind} --target {pair.target_dir} --prompts FILE`")
    return cached


def _need_draft(pair) -> None:
    if pair.draft is None:
        raise FileNotFoundError("the pair has no draft model (pass --draft with --target)")


def draft(pair):
    """Fixed k = 4, adaptive k from 4, the cost policy."""
    _need_draft(pair)
    return [("k=4", dict(draft=pair.draft, k=4, policy="fixed")),
            ("adaptive k from 4", dict(draft=pair.draft, k=4, adaptive_k=True, policy="fixed")),
            ("adaptive k, cost policy", dict(draft=pair.draft, k=4, adaptive_k=True, policy="cost"))]


def prompt_lookup(pair):
    """Chains of 4 and 16, a tree of 4 candidates x 4."""
    return [("chain k=4", dict(k=4)), ("chain k=16", dict(k=16)),
            ("tree 4 candidates x 4", dict(k=4, num_candidates=4))]


def lookahead(pair):
    """The defaults (W = 4, N = 4, G = 4)."""
    return [("W=4 N=4 G=4", {})]


def lookahead_draft(pair):
    """The lookahead defaults with the pair's draft."""
    _need_draft(pair)
    return [("k=4 W=4 N=4 G=4, adaptive", dict(draft=pair.draft))]


def medusa(pair):
    """The chain and the 16- and 32-node trees under the cost policy (the default), and the chain
    and the 16-node tree always drafting (what the heads give when the policy does not step in)."""
    heads = _drafter_dir(pair, "medusa")
    return [("chain", dict(heads=heads)), ("tree 16", dict(heads=heads, budget=16)),
            ("tree 32", dict(heads=heads, budget=32)),
            ("chain, always drafting", dict(heads=heads, policy="fixed")),
            ("tree 16, always drafting", dict(heads=heads, budget=16, policy="fixed"))]


def mtp(pair):
    """One draft per module, and k = 4 (reusing the last); one per module always drafting."""
    heads = _drafter_dir(pair, "mtp")
    return [("k = modules", dict(heads=heads)), ("k=4", dict(heads=heads, k=4)),
            ("k = modules, always drafting", dict(heads=heads, policy="fixed"))]


def dflash(pair):
    """The drafter's own block size."""
    return [("", dict(drafter=_drafter_dir(pair, "dflash")))]


def ddtree(pair):
    """Budgets 16 (the default) and 32."""
    drafter = _drafter_dir(pair, "dflash")
    return [("M=16", dict(drafter=drafter, budget=16)), ("M=32", dict(drafter=drafter, budget=32))]


def eagle3(pair):
    """A chain of 4 and the dynamic trees of 16 and 24 nodes (depth 5, top-4) under the cost policy,
    and chains of 2, 3 and 4 and the 16-node tree always drafting (on a CPU a verified row costs
    enough that short chains pay best)."""
    drafter = _drafter_dir(pair, "eagle3")
    return [("chain k=4", dict(drafter=drafter, tree=False, k=4)), ("tree 16", dict(drafter=drafter, budget=16)),
            ("tree 24", dict(drafter=drafter, budget=24))] + \
        [(f"chain k={k}, always drafting", dict(drafter=drafter, tree=False, k=k, policy="fixed")) for k in (2, 3, 4)] + \
        [("tree 16, always drafting", dict(drafter=drafter, budget=16, policy="fixed"))]


def cross_tokenizer(pair):
    """A draft model of another tokenizer (``bench/bench_real.py --cross-draft DIR``), k = 4, its text
    re-tokenized for the target: always drafting, and under the cost policy (the method's default).
    The tokenizers are the two folders' tokenizer.json."""
    draft = getattr(pair, "cross_draft", None)
    if draft is None:
        raise FileNotFoundError("no draft model of another tokenizer (bench/bench_real.py --cross-draft DIR)")
    options = dict(draft=draft, draft_tokenizer=pair.cross_draft_dir, target_tokenizer=pair.target_dir, k=4)
    return [("k=4", dict(options, policy="fixed")), ("k=4, cost policy", options)]


def diffusion(pair):
    """LOSSY. The cached zoo diffusion LM that shares the pair's tokenizer (one adapted from the
    pair's target, ``<pair>-diffusion-ar`` beside the pair folder, first), Fast-dLLM threshold 0.7
    with the dual cache (bench_diffusion's best setting within 10% of one-token-per-step perplexity
    on the v4 model); none is trained here (minutes)."""
    from zoo import diffusion as zoo_diffusion
    from zoo import pairs

    pair_dir = Path(pair.target_dir).parent
    folders = [pair_dir.parent / f"{pair_dir.name}-diffusion-ar"]
    folders += [pairs.zoo_root() / spec.name for spec in zoo_diffusion.SPECS.values()
                if pairs.SPECS[spec.pair].name == pair_dir.name]
    for folder in folders:
        if (folder / "report.json").exists():
            return [("threshold 0.7, dual cache",
                     dict(model=folder, block_length=32, threshold=0.7, use_cache="dual"))]
    raise FileNotFoundError(f"no trained zoo diffusion LM shares the tokenizer of {pair.target_dir} "
                            f"(python -m zoo.diffusion --zoo default|v4 trains one)")


CONFIGS = {
    "autoregressive": lambda pair: [("", {})],
    "draft": draft,
    "prompt_lookup": prompt_lookup,
    # the same method as prompt_lookup, benched under that name
    "ngram": lambda pair: [],
    "lookahead": lookahead,
    "lookahead+draft": lookahead_draft,
    "medusa": medusa,
    "mtp": mtp,
    "dflash": dflash,
    "ddtree": ddtree,
    "eagle3": eagle3,
    # Not in the end-to-end table: that table holds every lossless method to the plain model's
    # autoregressive output, and quantspec equals autoregressive decoding on its own int4 KV cache
    # instead; bench/bench_quantspec.py measures it against that baseline.
    "quantspec": lambda pair: [],
    "layer_skip": lambda pair: [("calibrated, k=4", dict(k=4))],
    "cross_tokenizer": cross_tokenizer,
    "diffusion": diffusion,
}


# ------------------------------------------------------------------------------ a real pair

# The draft vocabulary of the real pair's rows (ids 0 .. n - 1: byte-level BPE merge order, about
# frequency order; 96% of HumanEval's tokens under the Qwen2.5 tokenizer): the 0.5B drafter's
# 151,936-row head is 30% of its weight bytes.
DRAFT_VOCAB = 32768


def draft_real(pair):
    """Fixed k = 4 and the cost policy (adaptive k from 4, the method's default), each with the whole
    vocabulary and with a draft vocabulary (``draft_vocab``; built-in drafters)."""
    _need_draft(pair)
    rows = [("k=4", dict(draft=pair.draft, k=4, policy="fixed")),
            ("cost policy", dict(draft=pair.draft, k=4, adaptive_k=True))]
    if hasattr(pair.draft, "vocab_subset"):
        vocab = min(DRAFT_VOCAB, pair.draft.vocab_size)
        rows += [(f"k=4, draft vocab {vocab}", dict(draft=pair.draft, k=4, policy="fixed", draft_vocab=vocab)),
                 (f"cost policy, draft vocab {vocab}", dict(draft=pair.draft, k=4, adaptive_k=True,
                                                            draft_vocab=vocab)),
                 # where a verification row costs nearly a step (a CPU), drafts the drafter doubts
                 # are not worth verifying: stop at the first below 0.6
                 (f"k<=6, confidence 0.6, draft vocab {vocab}", dict(draft=pair.draft, k=6, policy="fixed",
                                                                      confidence_threshold=0.6, draft_vocab=vocab))]
    return rows


def quantspec_real(pair):
    """The target drafting for itself with its own 4-bit weights (k = 4), verified on its
    hierarchical 4-bit KV cache; its baseline is autoregressive decoding on that same cache."""
    from specdec_cuda.models import QuantKVModel

    target = QuantKVModel(pair.target)
    return [("k=4", dict(target=target, baseline="autoregressive, 4-bit KV cache", k=4))]


def layer_skip_real(pair):
    """The target drafting through a subset of its own layers (chosen by the calibration at the first
    prompt), k = 4: under the cost policy (the default) and always drafting, and with the draft passes'
    head over the first DRAFT_VOCAB ids (the draft method's draft vocabulary). Where the drafter cache
    holds an exit adapter trained for the target (Kangaroo; ``bash bench/train_exit_adapter.sh``),
    also through its first layers and that adapter, over its draft vocabulary: k = 3 and 4 always
    drafting, k = 4 under the cost policy."""
    from specdec_cuda import drafters
    from specdec_cuda.proposers.layer_skip import load_adapter

    vocab = min(DRAFT_VOCAB, pair.target.vocab_size)
    rows = [("calibrated, k=4", dict(k=4)), ("calibrated, k=4, fixed", dict(k=4, policy="fixed")),
            (f"calibrated, k=4, draft vocab {vocab}", dict(k=4, draft_vocab=vocab))]
    if drafters.find(pair.target, "exit") is not None:
        adapter = load_adapter(pair.target, True)
        rows += [("exit adapter, k=3, fixed", dict(k=3, adapter=adapter, policy="fixed")),
                 ("exit adapter, k=4, fixed", dict(k=4, adapter=adapter, policy="fixed")),
                 ("exit adapter, k=4", dict(k=4, adapter=adapter))]
    return rows


def prompt_lookup_real(pair):
    """Chains of 8 and 31 under the cost policy, and of 31 always drafting. HumanEval chat answers
    restate the request's code, and a long chain drafts as long as the copy goes on. 31 drafts and
    the root are 32 rows, two full 16-row blocks of the AMX tiles: a 33rd row costs a third pass
    (the 1.5B in bf16: 32 / 33 rows 1.85 / 2.15 one-token steps), and k=31 beat k=32 at T = 0 in
    both halves of the bench. Always drafting shows what the policy's plain steps and probes cost
    over requests of 64 tokens."""
    return [(f"chain k={k}", dict(k=k)) for k in (8, 31)] + [("chain k=31, always drafting", dict(k=31, policy="fixed"))]


def medusa_real(pair):
    """The heads over a draft vocabulary of DRAFT_VOCAB ids (four rows of the whole 152k-id head cost
    0.41 of the 1.5B's step, of 32,768 ids 0.11): the chain under the cost policy, and the chain of
    every head, of the first two heads and the 16-node tree always drafting."""
    heads = _drafter_dir(pair, "medusa")
    vocab = min(DRAFT_VOCAB, pair.target.vocab_size)
    return [(f"chain, draft vocab {vocab}", dict(heads=heads, draft_vocab=vocab)),
            (f"chain, always drafting, draft vocab {vocab}", dict(heads=heads, draft_vocab=vocab, policy="fixed")),
            (f"chain of 2, always drafting, draft vocab {vocab}",
             dict(heads=heads, tree=[(0,), (0, 0)], draft_vocab=vocab, policy="fixed")),
            (f"tree 16, always drafting, draft vocab {vocab}",
             dict(heads=heads, budget=16, draft_vocab=vocab, policy="fixed"))]


# The real bench's configurations (bench/bench_real.py): fewer than the zoo's (a real model's step
# costs 100x more), every method that needs no trained part; a method missing here runs with its
# CONFIGS entry, where a method that needs trained heads or a drafter finds them beside the target
# or in the drafter cache (python -m specdec_cuda.train), or is reported as not benched.
# ``target`` / ``baseline`` options: the model the method runs on and the row its greedy output is
# held to, when that is not the plain target's.
REAL_CONFIGS = {
    "draft": draft_real,
    "prompt_lookup": prompt_lookup_real,
    "ngram": lambda pair: [],
    "lookahead": lookahead,
    "lookahead+draft": lookahead_draft,
    "quantspec": quantspec_real,
    "layer_skip": layer_skip_real,
    "cross_tokenizer": cross_tokenizer,
    "medusa": medusa_real,
}


def configurations(name: str, pair, tables=(CONFIGS,)) -> tuple[list[tuple[str, dict]], str | None]:
    """Method ``name``'s ``(label, options)`` pairs on ``pair`` from the first of ``tables`` that
    lists it, and None; or no pairs and the reason it is not benched (no table lists it, the pair
    lacks its trained parts, or the table lists nothing for it)."""
    table = next((t for t in tables if name in t), None)
    if table is None:
        return [], "bench/configs.py lists no configurations for it"
    try:
        listed = table[name](pair)
    except FileNotFoundError as exc:  # the pair lacks the method's heads, drafter or own model
        return [], str(exc)
    if not listed:
        return [], "bench/configs.py lists no configuration (e.g. another name of a benched method)"
    return listed, None

