"""lookahead_mask (the tree family's lookahead-step layout) against reference/lookahead.py."""

from __future__ import annotations

import pytest
import torch

import specdec_cuda.ops as ops
from specdec_cuda.ops.status import STATUS_MALFORMED_TREE
from specdec_cuda.reference import lookahead as ref

pytestmark = pytest.mark.kernels  # the compiled ops against their references (make cpu-only-check)


def _random_case(seed: int, batch: int, num_guesses: int, guess_len: int):
    g = torch.Generator().manual_seed(seed)
    cache_len = torch.randint(0, 1000, (batch,), generator=g)
    guess_lens = torch.randint(0, guess_len + 1, (batch, num_guesses), generator=g)
    return cache_len, guess_lens


SHAPES = [  # (batch, G, K, W, L): awkward sizes, no guesses, no window, one level
    (1, 1, 1, 1, 1), (7, 3, 4, 5, 3), (3, 0, 0, 6, 4), (5, 4, 3, 0, 0), (2, 2, 5, 7, 1), (9, 7, 2, 3, 6),
]


@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_equals_reference_exactly(shape):
    batch, num_guesses, guess_len, window, levels = shape
    cache_len, guess_lens = _random_case(sum(shape), batch, num_guesses, guess_len)
    got = ops.lookahead_mask(cache_len, guess_lens, guess_len, window, levels)
    positions, mask, status = ref.lookahead_mask(cache_len, guess_lens, guess_len, window, levels)
    assert torch.equal(got.positions, positions)
    assert torch.equal(got.tree_mask, mask)
    assert torch.equal(got.status, status) and not status.any()


def test_window_is_its_jacobi_trajectories():
    # W = 3, L = 2, no guesses: the picture in csrc/kernels/tree/lookahead_mask.h.
    lay = ops.lookahead_mask(torch.tensor([5]), torch.zeros(1, 0, dtype=torch.int64), 0, 3, 2)
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0],
        [1, 1, 0, 0, 1, 0, 0],
        [1, 1, 1, 0, 0, 1, 0],
        [1, 1, 1, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(lay.tree_mask[0], expected)
    assert lay.positions[0].tolist() == [5, 6, 7, 8, 7, 8, 9]
    # Every window token reads a chain of consecutive positions ending at its own.
    for v in range(1, 7):
        seen = lay.positions[0][lay.tree_mask[0, v]].sort().values.tolist()
        assert seen == list(range(5, int(lay.positions[0, v]) + 1))


def test_guesses_are_chains_off_the_root_and_blind_to_the_window():
    lay = ops.lookahead_mask(torch.tensor([3]), torch.tensor([[2, 0, 3]]), 3, 2, 2)
    mask, pos = lay.tree_mask[0], lay.positions[0]
    guesses, window = range(1, 10), range(10, 14)
    assert not mask[1:10, 10:].any() and not mask[10:, 1:10].any()
    for v in guesses:
        g, i = divmod(v - 1, 3)
        real = i < [2, 0, 3][g]
        assert pos[v] == (3 + 1 + i if real else 3)
        want = {v} | ({0} | {1 + 3 * g + h for h in range(i + 1)} if real else set())
        assert set(torch.nonzero(mask[v]).flatten().tolist()) == want
    assert all(mask[v, 0] for v in window)


def test_same_mask_as_build_tree_for_chains():
    # G chains of the given lengths off the root: build_tree's mask is the guess block's.
    guess_lens, k = [3, 1, 2], 3
    parents = [-1]
    slots = [0]
    for g, n in enumerate(guess_lens):
        for i in range(n):
            parents.append(0 if i == 0 else len(parents) - 1)
            slots.append(1 + g * k + i)
    tree = ops.build_tree(torch.tensor(parents), torch.tensor([0, len(parents)]), torch.tensor([9]))
    lay = ops.lookahead_mask(torch.tensor([9]), torch.tensor([guess_lens]), k, 4, 2)
    idx = torch.tensor(slots)
    assert torch.equal(lay.tree_mask[0][idx][:, idx], tree.tree_mask[0])
    assert torch.equal(lay.positions[0][idx], tree.positions[0])


def test_flagged_rows_and_clear_errors():
    cache_len = torch.tensor([4, 4, -1])
    guess_lens = torch.tensor([[1, 2], [3, 0], [0, 0]])
    lay = ops.lookahead_mask(cache_len, guess_lens, 2, 2, 1, check=False)
    assert lay.status.tolist() == [0, STATUS_MALFORMED_TREE, STATUS_MALFORMED_TREE]
    positions, mask, status = ref.lookahead_mask(cache_len, guess_lens, 2, 2, 1)
    assert torch.equal(lay.status, status) and torch.equal(lay.tree_mask, mask)
    assert torch.equal(lay.positions, positions)
    with pytest.raises(ValueError, match=r"row 1: guess_lens \[3, 0\]"):
        ops.lookahead_mask(cache_len, guess_lens, 2, 2, 1)
    with pytest.raises(ValueError, match="guess_lens: expected shape"):
        ops.lookahead_mask(torch.tensor([1, 2]), torch.tensor([[1]]), 1, 1, 1)
    with pytest.raises(ValueError, match="window: must be >= 0"):
        ops.lookahead_mask(torch.tensor([1]), torch.tensor([[1]]), 1, -1, 1)
    with pytest.raises(TypeError, match="levels: expected an int"):
        ops.lookahead_mask(torch.tensor([1]), torch.tensor([[1]]), 1, 1, 1.5)
    with pytest.raises(TypeError, match="guess_lens: expected an int64 or int32"):
        ops.lookahead_mask(torch.tensor([1]), torch.tensor([[1.0]]), 1, 1, 1)
    with pytest.raises(RuntimeError, match="at most 256 guesses"):
        ops.lookahead_mask(torch.tensor([1]), torch.zeros(1, 257, dtype=torch.int64), 1, 1, 1)


def test_opcheck_and_compile():
    cache_len, guess_lens = _random_case(0, 3, 2, 3)
    t = 1 + 2 * 3 + 4 * 2
    args = (cache_len, guess_lens, 3, 4, 2, torch.empty(3, t, dtype=torch.int64),
            torch.empty(3, t, t, dtype=torch.bool), torch.empty(3, dtype=torch.int32))
    torch.library.opcheck(torch.ops.specdec.lookahead_mask, args)

    def step(c, g):
        return ops.lookahead_mask(c, g, 3, 4, 2, check=False).tree_mask

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(cache_len, guess_lens), step(cache_len, guess_lens))


@pytest.mark.cuda
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s) for s in SHAPES])
def test_cuda_equals_cpu(shape):
    batch, num_guesses, guess_len, window, levels = shape
    cache_len, guess_lens = _random_case(7 + sum(shape), batch, num_guesses, guess_len)
    if batch > 1:  # one flagged row too
        guess_lens[1, :1] = guess_len + 1 if num_guesses else 0
        cache_len[-1] = -3
    cpu = ops.lookahead_mask(cache_len, guess_lens, guess_len, window, levels, check=False)
    gpu = ops.lookahead_mask(cache_len.cuda(), guess_lens.cuda(), guess_len, window, levels, check=False)
    for a, b in zip(cpu, gpu):
        assert torch.equal(a, b.cpu())


@pytest.mark.parametrize("seed", range(25))
def test_random_shapes_and_bad_rows_equal_the_reference(seed):
    g = torch.Generator().manual_seed(100 + seed)
    batch, num_guesses, guess_len, window, levels = (int(x) for x in torch.randint(0, 6, (5,), generator=g))
    batch += 1
    cache_len = torch.randint(-2, 50, (batch,), generator=g)
    guess_lens = torch.randint(-1, guess_len + 2, (batch, num_guesses), generator=g)
    got = ops.lookahead_mask(cache_len, guess_lens, guess_len, window, levels, check=False)
    want = ref.lookahead_mask(cache_len, guess_lens, guess_len, window, levels)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_docstring_example():
    import doctest

    from specdec_cuda.ops import tree

    finder = doctest.DocTestFinder()
    runner = doctest.DocTestRunner()
    for test in finder.find(tree.lookahead_mask, "lookahead_mask", globs={}):
        runner.run(test)
    assert runner.failures == 0 and runner.tries > 0
