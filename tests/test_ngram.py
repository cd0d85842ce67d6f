"""The C++ n-gram index (specdec_cuda.ngram) against python/specdec_cuda/reference/ngram.py."""

from __future__ import annotations

import doctest
import random
import zlib

import pytest
import torch

import specdec_cuda.ngram as ngram
from specdec_cuda.ngram import NgramIndex, extend_rows, lookup
from specdec_cuda.reference.ngram import NgramIndexRef, lookup_ref
from specdec_cuda.reference.tree import tree_problem

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)


def random_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def repetitive_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    """Copies of a few blocks with point edits: code-editing-like text, where long suffixes recur."""
    blocks = [random_tokens(rng, rng.randrange(3, 12), vocab) for _ in range(3)]
    out: list[int] = []
    while len(out) < n:
        block = list(rng.choice(blocks))
        if rng.random() < 0.4:
            block[rng.randrange(len(block))] = rng.randrange(vocab)
        out += block
    return out[:n]


def assert_same(got, want, what=""):
    for name, g, w in zip(("tokens", "parents", "num_nodes"), got, want):
        assert torch.equal(g, w), f"{what} {name}:\n{g}\n!=\n{w}"


def as_tree_op_parents(parents: torch.Tensor, num_nodes: int) -> list[int]:
    """Draft parents -> the tree ops' row layout (node 0 = root with parent -1)."""
    return [-1] + parents[:num_nodes].tolist()


# ----------------------------------------------------------------------------------------------
# exact agreement with the reference


@pytest.mark.parametrize("kind", ["random", "repetitive"])
@pytest.mark.parametrize("n_min,n_max,k,num_candidates,max_occurrences", [
    (1, 4, 5, 1, 64),
    (2, 3, 4, 3, 64),
    (1, 1, 1, 4, 2),
    (1, 6, 7, 5, 3),
])
def test_incremental_lookup_matches_reference(kind, n_min, n_max, k, num_candidates, max_occurrences):
    rng = random.Random(zlib.crc32(repr((kind, n_min, n_max, k, num_candidates)).encode()))
    batch, vocab = 7, 9 if kind == "random" else 50
    make = random_tokens if kind == "random" else repetitive_tokens
    seqs = [make(rng, rng.randrange(0, 160), vocab) for _ in range(batch)]
    seqs[3] = []  # a row that never gets tokens
    idx = [NgramIndex(n_min, n_max) for _ in range(batch)]
    ref = [NgramIndexRef(n_min, n_max) for _ in range(batch)]
    idx[5] = ref[5] = None  # a row without an index: no draft
    done = [0] * batch
    steps = drafted = 0
    while any(done[b] < len(seqs[b]) for b in range(batch) if idx[b] is not None):
        # commit a few tokens per row, batched, like accept() after a verification step
        m = 1 + rng.randrange(k + 1)
        chunk = torch.full((batch, m), -1, dtype=torch.int64)
        counts = torch.zeros(batch, dtype=torch.int64)
        for b in range(batch):
            if idx[b] is None:
                continue
            new = seqs[b][done[b]:done[b] + rng.randrange(m + 1)]
            chunk[b, :len(new)] = torch.tensor(new, dtype=torch.int64)
            counts[b] = len(new)
            ref[b].extend(new)
            done[b] += len(new)
        extend_rows(idx, chunk, counts)
        max_nodes = torch.tensor([rng.randrange(-1, k * num_candidates + 3) for _ in range(batch)])
        # a depth cap per row on every other step (what StepState.max_draft asks of a tree)
        max_depth = (torch.tensor([rng.randrange(-1, k + 2) for _ in range(batch)])
                     if steps % 2 else None)
        got = lookup(idx, k, num_candidates, max_nodes=max_nodes, max_depth=max_depth,
                     max_occurrences=max_occurrences)
        want = lookup_ref(ref, k, num_candidates, max_nodes=max_nodes, max_depth=max_depth,
                          max_occurrences=max_occurrences)
        assert_same(got, want, f"step {steps}")
        drafted += int(got.num_nodes.sum())
        for b in range(batch):
            n = int(got.num_nodes[b])
            assert tree_problem(as_tree_op_parents(got.parents[b], n), n + 1) is None
        steps += 1
    for b in range(batch):
        if idx[b] is not None:
            assert idx[b].tokens().tolist() == seqs[b]
    # drafts were found along the way (so the comparison above is not vacuous)
    assert drafted > 0


def test_counts_match_reference():
    rng = random.Random(3)
    seq = repetitive_tokens(rng, 400, 20)
    ix, ref = NgramIndex(2, 5), NgramIndexRef(2, 5)
    ix.extend(seq)
    ref.extend(seq)
    assert len(ref.occurrences) > 100
    for gram, positions in ref.occurrences.items():
        assert ix.count(list(gram)) == len(positions)
    assert ix.count([999, 998]) == 0
    assert ix.count(seq[-2:]) == ref.count(seq[-2:])  # the suffix, whose last token has no successor


def test_ranking_count_then_recency():
    # after "1 2" came 3 (twice), then 4 (once, newest): count wins over recency
    ix = NgramIndex(1, 2)
    ix.extend([1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 4, 9, 1, 2])
    d = lookup([ix], k=1, num_candidates=2)
    assert d.tokens[0, :2].tolist() == [3, 4] and d.num_nodes.tolist() == [2]
    # equal counts: the newest first
    ix = NgramIndex(1, 2)
    ix.extend([1, 2, 3, 9, 1, 2, 4, 9, 1, 2])
    assert lookup([ix], k=1, num_candidates=2).tokens[0, :2].tolist() == [4, 3]
    # only the newest max_occurrences occurrences are ranked
    assert lookup([ix], k=1, num_candidates=2, max_occurrences=1).num_nodes.tolist() == [1]


def test_ranking_prefers_a_full_continuation_to_a_cut_one():
    # after "1" came "8 9 1" and, newest, "7 1" cut by the end of the text: equal counts, so the
    # longer continuation drafts first (recency alone would pick the two-token one)
    ix = NgramIndex(1, 1)
    ix.extend([1, 8, 9, 1, 7, 1])
    d = lookup([ix], k=3)
    assert d.tokens[0, :3].tolist() == [8, 9, 1] and d.num_nodes.tolist() == [3]
    ref = NgramIndexRef(1, 1)
    ref.extend([1, 8, 9, 1, 7, 1])
    assert ref.candidates([1, 8, 9, 1, 7, 1], k=3, max_occurrences=64) == [(8, 9, 1), (7, 1)]


def test_tree_merges_shared_prefixes_in_bfs_order():
    ix = NgramIndex(1, 1)
    # after 7: "1 2 3" (newest), "1 5 6", "8 9 9"
    ix.extend([7, 8, 9, 9, 0, 7, 1, 5, 6, 0, 7, 1, 2, 3, 0, 7])
    d = lookup([ix], k=3, num_candidates=3)
    # candidates by recency: 1 2 3 | 1 5 6 | 8 9 9 -> tree root -> {1 -> {2 -> 3, 5 -> 6}, 8 -> 9 -> 9}
    n = int(d.num_nodes[0])
    assert n == 8
    assert d.tokens[0, :n].tolist() == [1, 8, 2, 5, 9, 3, 6, 9]
    assert d.parents[0, :n].tolist() == [0, 0, 1, 1, 2, 3, 4, 5]
    # the budget keeps the best-ranked candidate whole first
    d = lookup([ix], k=3, num_candidates=3, max_nodes=4)
    assert d.tokens[0, :4].tolist() == [1, 2, 5, 3] and d.parents[0, :4].tolist() == [0, 1, 1, 2]
    assert d.tokens[0, 4:].eq(0).all() and d.parents[0, 4:].eq(0).all()  # padding
    # a depth cap cuts every candidate; shared prefixes still merge
    d = lookup([ix], k=3, num_candidates=3, max_depth=2)
    n = int(d.num_nodes[0])
    assert d.tokens[0, :n].tolist() == [1, 8, 2, 5, 9] and d.parents[0, :n].tolist() == [0, 0, 1, 1, 2]


def test_documents_do_not_leak():
    corpus = NgramIndex.from_corpus([[1, 2, 3], [4, 1, 2]], n_min=1, n_max=2)
    ref = NgramIndexRef(1, 2)
    for doc in ([1, 2, 3], [4, 1, 2]):
        ref.start_document()
        ref.extend(doc)
    assert corpus.num_documents == 2 and len(corpus) == 6
    assert corpus.count([3, 4]) == 0  # crosses the boundary
    assert corpus.count([1, 2]) == 1  # the second "1 2" has no successor in its document
    row = NgramIndex(1, 2)
    row.extend([9, 1, 2])  # no repeat of its own
    got = lookup([row], k=4, corpus=corpus)
    # the continuation stops at the end of the first document
    assert got.tokens[0, :1].tolist() == [3] and got.num_nodes.tolist() == [1]


@pytest.mark.parametrize("num_candidates", [1, 2, 4])
def test_corpus_fills_slots_like_reference(num_candidates):
    rng = random.Random(num_candidates)
    docs = [repetitive_tokens(rng, rng.randrange(5, 80), 12) for _ in range(6)]
    corpus = NgramIndex.from_corpus(docs, n_min=1, n_max=3)
    corpus_ref = NgramIndexRef(1, 3)
    for doc in docs:
        corpus_ref.start_document()
        corpus_ref.extend(doc)
    batch = 5
    rows = [repetitive_tokens(rng, rng.randrange(1, 40), 12) for _ in range(batch)]
    idx = [NgramIndex(2, 4) for _ in rows]
    ref = [NgramIndexRef(2, 4) for _ in rows]
    for i, r, s in zip(idx, ref, rows):
        i.extend(s)
        r.extend(s)
    got = lookup(idx, 3, num_candidates, corpus=corpus, max_occurrences=8)
    want = lookup_ref(ref, 3, num_candidates, corpus=corpus_ref, max_occurrences=8)
    assert_same(got, want)
    without = lookup(idx, 3, num_candidates)
    assert int(got.num_nodes.sum()) > int(without.num_nodes.sum())  # the corpus added guesses


def test_no_match_and_empty():
    ix = NgramIndex(1, 3)
    assert lookup([ix], k=4).num_nodes.tolist() == [0]
    ix.extend([1, 2, 3, 4])
    d = lookup([ix, None], k=4)
    assert d.num_nodes.tolist() == [0, 0] and d.tokens.shape == (2, 4)
    assert lookup([], k=2).tokens.shape == (0, 2)


def test_extend_rows_equals_extend():
    rng = random.Random(5)
    a = [NgramIndex(1, 3) for _ in range(3)]
    b = [NgramIndex(1, 3) for _ in range(3)]
    for _ in range(20):
        tok = torch.randint(0, 6, (3, 4), generator=torch.Generator().manual_seed(rng.randrange(99)))
        cnt = torch.tensor([rng.randrange(5) for _ in range(3)])
        extend_rows(a, tok, cnt)
        for i in range(3):
            b[i].extend(tok[i, :int(cnt[i])])
    for i in range(3):
        assert torch.equal(a[i].tokens(), b[i].tokens())
    assert_same(lookup(a, 3, 2), lookup(b, 3, 2))


def test_memory_reported_and_grows():
    ix = NgramIndex(1, 4)
    empty = ix.memory_bytes()
    ix.extend(list(range(1000)) * 2)
    full = ix.memory_bytes()
    # at least the tokens (4 B) and one chain entry per order (4 x 4 B) per token
    assert full >= empty + 2000 * (4 + 4 * 4)
    assert "memory_bytes" in repr(ix)


def test_module_docstring_example():
    assert doctest.testmod(ngram, raise_on_error=False).failed == 0


# ----------------------------------------------------------------------------------------------
# save / load


def test_save_load_round_trip(tmp_path):
    rng = random.Random(7)
    docs = [repetitive_tokens(rng, rng.randrange(1, 100), 30) for _ in range(10)]
    corpus = NgramIndex.from_corpus(docs, n_min=2, n_max=5)
    path = tmp_path / "corpus.ngram"
    corpus.save(path)
    loaded = NgramIndex.load(path)
    assert (loaded.n_min, loaded.n_max, loaded.num_documents) == (2, 5, 10)
    assert torch.equal(loaded.tokens(), corpus.tokens())
    assert loaded._index.document_starts() == corpus._index.document_starts()
    rows = []
    for _ in range(6):
        r = NgramIndex(1, 3)
        r.extend(rng.choice(docs)[: rng.randrange(1, 20)])
        rows.append(r)
    assert_same(lookup(rows, 4, 3, corpus=loaded), lookup(rows, 4, 3, corpus=corpus))
    # a request index saves too, and an empty one
    empty = NgramIndex(1, 1)
    empty.save(tmp_path / "empty.ngram")
    assert len(NgramIndex.load(tmp_path / "empty.ngram")) == 0


def _image(tmp_path):
    ix = NgramIndex.from_corpus([[1, 2, 3, 1, 2], [5, 6]], n_min=1, n_max=2)
    path = tmp_path / "ix.ngram"
    ix.save(path)
    return path, bytearray(path.read_bytes())


@pytest.mark.parametrize("damage,match", [
    (lambda b: b[:20], "shorter than"),
    (lambda b: b"", "shorter than"),
    (lambda b: b"NOTNGRAM" + b[8:], "magic"),
    (lambda b: b[:8] + (2).to_bytes(4, "little") + b[12:], "format version 2"),
    (lambda b: b[:-3], "truncated or corrupt"),
    (lambda b: b + b"\0", "truncated or corrupt"),
    (lambda b: b[:24] + (10**12).to_bytes(8, "little") + b[32:], "corrupt header"),
    (lambda b: b[:44] + bytes([b[44] ^ 1]) + b[45:], "checksum"),
])
def test_corrupt_file_is_a_clear_error(tmp_path, damage, match):
    path, image = _image(tmp_path)
    path.write_bytes(bytes(damage(image)))
    with pytest.raises(ValueError, match=match) as info:
        NgramIndex.load(path)
    assert str(path) in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        NgramIndex.load(tmp_path / "nope.ngram")


# ----------------------------------------------------------------------------------------------
# bad arguments


@pytest.mark.parametrize("n_min,n_max", [(0, 3), (3, 2), (1, 33), (-1, -1)])
def test_bad_orders(n_min, n_max):
    with pytest.raises(ValueError, match="n_min"):
        NgramIndex(n_min, n_max)


def test_bad_tokens_leave_the_index_unchanged():
    ix = NgramIndex(1, 2)
    ix.extend([1, 2, 3])
    with pytest.raises(ValueError, match=r"tokens\[1\] = -5"):
        ix.extend([4, -5, 6])
    with pytest.raises(ValueError, match="2147483648"):
        ix.extend([2**31])
    with pytest.raises(TypeError, match="float"):
        ix.extend(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="1-D"):
        ix.extend(torch.ones(2, 2, dtype=torch.int64))
    assert ix.tokens().tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="outside this index's orders"):
        ix.count([1, 2, 3])


def test_bad_lookup_arguments():
    ix = NgramIndex(1, 2)
    ix.extend([1, 2, 1])
    with pytest.raises(ValueError, match="k=0"):
        lookup([ix], k=0)
    with pytest.raises(ValueError, match="num_candidates=0"):
        lookup([ix], k=2, num_candidates=0)
    with pytest.raises(ValueError, match="max_occurrences=0"):
        lookup([ix], k=2, max_occurrences=0)
    with pytest.raises(ValueError, match=r"max_nodes: expected shape \(2,\)"):
        lookup([ix, ix], k=2, max_nodes=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"max_depth: expected shape \(2,\)"):
        lookup([ix, ix], k=2, max_depth=[1])
    with pytest.raises(TypeError, match="max_nodes"):
        lookup([ix], k=2, max_nodes=torch.tensor([1.5]))
    with pytest.raises(TypeError, match=r"indexes\[1\]"):
        lookup([ix, [1, 2]], k=2)
    with pytest.raises(TypeError, match="corpus"):
        lookup([ix], k=2, corpus="corpus")


def test_bad_extend_rows_arguments():
    idx = [NgramIndex(1, 2), NgramIndex(1, 2)]
    idx[0].extend([1])
    tok = torch.tensor([[1, 2], [3, 4]])
    with pytest.raises(ValueError, match=r"num_tokens\[1\] = 3"):
        extend_rows(idx, tok, torch.tensor([1, 3]))
    with pytest.raises(ValueError, match=r"tokens\[1, 0\] = -1"):
        extend_rows(idx, torch.tensor([[1, 2], [-1, 4]]), torch.tensor([2, 1]))
    with pytest.raises(ValueError, match="must have 2 rows"):
        extend_rows(idx, tok[:1], torch.tensor([1]))
    with pytest.raises(ValueError, match=r"indexes\[1\] is None"):
        extend_rows([idx[0], None], tok, torch.tensor([1, 1]))
    # every error above left both indexes as they were
    assert idx[0].tokens().tolist() == [1] and len(idx[1]) == 0


# ----------------------------------------------------------------------------------------------
# method="prompt_lookup" (proposers/ngram.py)


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    from decoding_models import load_backend, make_checkpoint

    folder = make_checkpoint(tmp_path_factory.mktemp("ngram") / "target", seed=0)
    return load_backend(folder, "builtin")


# Prompts that repeat themselves, as in code editing, and a ragged batch of short ones.
LOOKUP_PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 2, 3], [20, 21, 22, 20, 21], [4]]


@pytest.mark.parametrize("options", [
    dict(k=4),
    dict(k=3, num_candidates=4, n_min=1, n_max=2),
    dict(k=5, num_candidates=2, max_occurrences=1),
])
def test_prompt_lookup_greedy_equals_autoregressive(tiny_target, options):
    import specdec_cuda

    ar = specdec_cuda.generate(tiny_target, LOOKUP_PROMPTS, max_new_tokens=40)
    out = specdec_cuda.generate(tiny_target, LOOKUP_PROMPTS, method="prompt_lookup", max_new_tokens=40,
                                **options)
    assert out.tokens == ar.tokens
    # drafts were proposed and some accepted, so fewer target forwards than tokens
    assert out.metrics.acceptance_rate > 0


def test_prompt_lookup_sampled_equals_autoregressive_with_the_same_seed(tiny_target):
    # sample-and-match with one-hot guesses emits exactly the autoregressive samples of the seed
    import specdec_cuda

    kw = dict(max_new_tokens=30, temperature=0.8, seed=3)
    ar = specdec_cuda.generate(tiny_target, LOOKUP_PROMPTS, **kw)
    out = specdec_cuda.generate(tiny_target, LOOKUP_PROMPTS, method="prompt_lookup", k=3,
                                num_candidates=2, **kw)
    assert out.tokens == ar.tokens


def test_prompt_lookup_index_holds_the_committed_text(tiny_target):
    from specdec_cuda.decoding import SamplingParams, decode
    from specdec_cuda.proposers.ngram import PromptLookupProposer

    proposer = PromptLookupProposer(k=3, num_candidates=2)
    params = SamplingParams.make(len(LOOKUP_PROMPTS), 0.0, 0, 1.0, 0, tiny_target.device)
    out = decode(tiny_target, LOOKUP_PROMPTS, params, 20, proposer=proposer)
    for b, prompt in enumerate(LOOKUP_PROMPTS):
        committed = proposer.indexes[b].tokens().tolist()
        # exactly the committed text: the prompt, then every emitted token (nothing rejected)
        assert committed[:len(prompt)] == prompt
        assert committed[len(prompt):] == out.tokens[b]
    assert all(m > 0 for m in proposer.memory_bytes())


def test_prompt_lookup_with_a_corpus_file(tiny_target, tmp_path):
    import specdec_cuda

    ar = specdec_cuda.generate(tiny_target, LOOKUP_PROMPTS, max_new_tokens=20)
    corpus = NgramIndex.from_corpus([row for row in ar.tokens], n_min=1, n_max=3)
    corpus.save(tmp_path / "c.ngram")
    out = specdec_cuda.generate(tiny_target, LOOKUP_PROMPTS, method="prompt_lookup", max_new_tokens=20,
                                k=4, num_candidates=2, corpus=str(tmp_path / "c.ngram"))
    assert out.tokens == ar.tokens
    # the corpus holds the very continuations: most drafts are accepted
    assert out.metrics.acceptance_rate > 0.5


def test_prompt_lookup_bad_options(tiny_target):
    import specdec_cuda

    with pytest.raises(ValueError, match="n_min"):
        specdec_cuda.generate(tiny_target, [[1, 2]], method="prompt_lookup", n_min=0)
    with pytest.raises(ValueError, match="k=0"):
        specdec_cuda.generate(tiny_target, [[1, 2]], method="prompt_lookup", k=0)
    with pytest.raises(TypeError, match="corpus"):
        specdec_cuda.generate(tiny_target, [[1, 2]], method="prompt_lookup", corpus=3)
