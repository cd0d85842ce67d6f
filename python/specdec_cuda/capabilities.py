"""What a checkpoint folder supports out of the box: ``python -m specdec_cuda methods --model DIR``.

Per registered method: whether it runs on the folder with no options (the built-in model reads
the family; ``mtp`` needs MTP layers in the checkpoint: MiMo's on the built-in model, DeepSeek-V3's,
GLM-4.5's and Qwen3-Next's on the transformers adapter), and what it needs otherwise (a draft
model, trained heads or a drafter, another backend).
"""

from __future__ import annotations

from pathlib import Path

from . import methods
from .models.config import UnsupportedModelError, family_of
from .models.native_mtp import detect

# What a method needs beyond the target itself; methods not listed need nothing.
_NEEDS = {
    "draft": "a draft model with this tokenizer: draft=<model> (another tokenizer: cross_tokenizer)",
    "lookahead+draft": "a draft model with this tokenizer: draft=<model>",
    "cross_tokenizer": "a draft model of another tokenizer: draft=<model> (tokenizers from the model folders)",
    "medusa": "Medusa heads trained for it: heads=<folder>, or cached by python -m specdec_cuda.train medusa",
    "dflash": "a DFlash drafter trained for it: drafter=<folder>, or cached by python -m specdec_cuda.train dflash",
    "ddtree": "a DFlash drafter trained for it: drafter=<folder>, or cached by python -m specdec_cuda.train dflash",
    "eagle3": "an EAGLE-3 drafter trained for it: drafter=<folder>, or cached by python -m specdec_cuda.train eagle3",
    "diffusion": "a diffusion LM of its own (a generation mode, not speculation on this model)",
}
# Notes on methods that run with no options but on a wrapped target.
_NOTES = {"quantspec": "on the built-in model over its int4 KV cache: models.QuantKVModel(models.load(DIR))",
          "layer_skip": "optionally with an exit adapter trained for it: adapter=<folder>, or adapter=True for the one "
                        "cached by python -m specdec_cuda.train exit"}
_BUILTIN_ONLY = ("quantspec", "layer_skip")  # they run the built-in model's own forward paths


def checkpoint_methods(folder: str | Path) -> tuple[list[tuple[str, bool, str]], str]:
    """([(method, runs with no options, note)], a line about the checkpoint) for a HF folder."""
    from .models.loader import SafetensorsFolder, read_checkpoint_config

    folder, _, raw = read_checkpoint_config(folder, "a Hugging Face checkpoint folder")
    try:
        family = family_of(raw, str(folder / "config.json"))
        builtin, why_not = True, ""
    except UnsupportedModelError as exc:
        family, builtin, why_not = None, False, str(exc).split(";")[0]
    native = detect(raw, SafetensorsFolder(folder))
    about = (f"{folder}: {raw.get('model_type', '?')}, " + (f"the built-in model runs it ({family})" if builtin
             else "the built-in model does not run it: models.HFCausalLM does")
             + (f"; it carries {native.describe()}" if native else "; no MTP layers"))
    rows = []
    for spec in methods.available():
        ok, note = spec.name not in _NEEDS, _NEEDS.get(spec.name, _NOTES.get(spec.name, ""))
        if spec.name == "mtp":
            ok = native is not None and (native.backend == "builtin") == builtin
            note = native.describe() if native else "no MTP layers in the checkpoint: heads=<folder> trained for it"
            if native is not None and native.backend == "transformers":
                note += "; target: models.HFCausalLM(AutoModelForCausalLM.from_pretrained(DIR))"
        if spec.name in _BUILTIN_ONLY and not builtin:
            ok, note = False, f"runs on the built-in model only ({why_not})"
        rows.append((spec.name, ok, note))
    return rows, about


def format_checkpoint_methods(rows: list[tuple[str, bool, str]], about: str) -> str:
    lines = [about, "", f"{'method':<16} {'ready':<6} needs / notes"]
    lines += [f"{name:<16} {'yes' if ok else 'no':<6} {note}" for name, ok, note in rows]
    return "\n".join(lines)
