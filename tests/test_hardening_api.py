"""Issue 12, the items in the decoding entry points (decoding.py / api.py).

Checks at the top of ``decode`` / ``SpeculativeDecoder.generate``, before anything is sized:
* ``max_new_tokens`` an int (not bool) >= 0, else ``ValueError("max_new_tokens must be an int >= 0,
  got ...")`` (a negative value used to shrink the cache and report a KV-cache overflow);
* prompt token ids integers: a float / bool tensor, or a list holding a float or bool, raises
  ``TypeError("prompts must hold integer token ids, got ...")`` (they used to be truncated, 1.7 to 1).
"""

from __future__ import annotations

import pytest
import torch

import specdec_cuda
from decoding_models import load_backend, make_checkpoint


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    folder = make_checkpoint(tmp_path_factory.mktemp("hardening_api") / "target", seed=0)
    return load_backend(folder, "builtin")


@pytest.mark.parametrize("n", [-1, -5])
def test_negative_max_new_tokens_names_it(target, n):
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 0"):
        specdec_cuda.generate(target, [[1, 2, 3]], max_new_tokens=n)


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
