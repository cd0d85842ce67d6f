"""Batch invariance (``models.protocol.batch_invariant``): a target whose forwards may round a row
differently in a wider forward is named once, in an ``InexactVerificationWarning`` when a
speculative method is set up on it, and in every run's ``Metrics.batch_invariant``. The built-in
model on its packed CPU path (and GGUF blocks, tests/test_gguf_model.py) is invariant; the torch
path and the transformers adapter are not."""

from __future__ import annotations

import pytest
import torch

import specdec_cuda
from decoding_models import load_backend, make_checkpoint
from specdec_cuda import models


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch_invariance")
    return (make_checkpoint(root / "target", seed=0),)
def test_a_target_that_is_not_batch_invariant_is_named_once_and_in_metrics(folders):
    import warnings

    from specdec_cuda import api
    from specdec_cuda.models.protocol import batch_invariant

    torch_path = load_backend(folders[0], "builtin")  # float64: the torch path
    hf = load_backend(folders[0], "hf")
    packed = models.load(folders[0], dtype=torch.float32)
    assert not batch_invariant(torch_path) and not batch_invariant(hf)
    assert batch_invariant(packed) == packed.packed
    api._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = specdec_cuda.generate(hf, [[1, 2, 3]], method="prompt_lookup", max_new_tokens=4)
        specdec_cuda.generate(hf, [[1, 2, 3]], method="prompt_lookup", max_new_tokens=4)  # not again
        specdec_cuda.generate(hf, [[1, 2, 3]], method="autoregressive", max_new_tokens=4)  # nothing verified
        specdec_cuda.generate(packed, [[1, 2, 3]], method="prompt_lookup", max_new_tokens=4)
    inexact = [w for w in caught if issubclass(w.category, specdec_cuda.InexactVerificationWarning)]
    assert len(inexact) == 1 and "transformers adapter" in str(inexact[0].message)
    assert out.metrics.batch_invariant is False and out.metrics.as_dict()["batch_invariant"] is False
    if packed.packed:
        assert specdec_cuda.generate(packed, [[1, 2]], max_new_tokens=2).metrics.batch_invariant is True
