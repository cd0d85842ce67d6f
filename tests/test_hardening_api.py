"""Issue 12, the items in the decoding entry points (decoding.py / api.py, being rewritten by the
lead): written as failing tests, marked xfail(strict) so they turn into failures, to unmark, as
soon as the rewrite makes them pass.

Checks they expect, at the top of ``decode`` / ``Decoder.generate`` before anything is sized:
* ``max_new_tokens`` an int (not bool) >= 0, else ``ValueError("max_new_tokens must be an int >= 0,
  got ...")`` (today a negative value shrinks the cache and reports a KV-cache overflow);
* prompt token ids integers: a float / bool tensor, or a list holding a float or bool, raises
  ``TypeError("prompts must hold integer token ids, got ...")`` (today ``_as_prompts`` /
  ``torch.as_tensor(p, dtype=torch.int64)`` truncate 1.7 to 1).
"""

from __future__ import annotations

import pytest
import torch

import specdec_cuda
from decoding_models import load_backend, make_checkpoint

LEAD = pytest.mark.xfail(strict=True, reason="lead: decoding rewrite")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("hardening_api") / "target", seed=0)
    return load_backend(folder, "builtin")


@LEAD
@pytest.mark.parametrize("n", [-1, -5])
def test_negative_max_new_tokens_names_it(target, n):
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        specdec_cuda.generate(target, [[1, 2, 3]], max_new_tokens=n)


@LEAD
@pytest.mark.parametrize("prompts", [[[1.7, 2.2, 3.9]], torch.tensor([[1.5, 2.0]]), [[1, True]]],
                         ids=["float-list", "float-tensor", "bool-in-list"])
def test_float_prompt_ids_are_rejected(target, prompts):
    with pytest.raises(TypeError, match="prompts must hold integer token ids"):
        specdec_cuda.generate(target, prompts, max_new_tokens=2)


def test_integer_prompts_still_decode(target):
    # the contract the checks above must keep: integer ids (lists, int32 / int64 tensors) decode
    for prompts in ([[1, 2, 3]], torch.tensor([[1, 2, 3]], dtype=torch.int32)):
        out = specdec_cuda.generate(target, prompts, max_new_tokens=2)
        assert len(out.tokens[0]) == 2
