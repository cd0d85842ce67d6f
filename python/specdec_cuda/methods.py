"""The method registry: every decoding method by name, with its options and whether it is lossless.

``specdec_cuda.generate(method=...)`` and ``SpeculativeDecoder(method=...)`` look methods up here;
``python -m specdec_cuda methods`` prints the table. A method joins by calling ``register`` from
its module; the conformance suite (``tests/test_conformance.py``) runs every registered lossless
method, so a method that is registered is a method that is tested.

Three kinds:

* ``"autoregressive"``: the baseline, the loop without a proposer (``make`` returns None).
* ``"speculative"``: ``make(target, **options)`` returns a proposer (``proposers.base.Proposer``)
  that the one loop in ``decoding.py`` runs.
* ``"generation"``: ``make(model, **options)`` returns an object with
  ``generate(prompts, params, max_new_tokens, eos_token_id, stream) -> GenerationResult``, a mode
  of its own (the diffusion LM).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

# Options of the loop itself, accepted by every speculative method.
LOOP_OPTIONS = {
    "policy": 'speculation policy: "cost" (default: measured costs and acceptance choose each row\'s draft '
              'length, 0 included, remembered per model and machine), "fixed" (always the most the method '
              'drafts), or a SpeculationPolicy',
}


@dataclass(frozen=True)
class MethodSpec:
    """One registered method.

    ``options`` maps each keyword the method takes to a one-line description (defaults included);
    ``required`` names the options that must be given; ``default_policy`` is the speculation
    policy the method runs with unless the caller picks one. (Which configurations the
    repository's end-to-end bench runs is the bench's business: ``bench/configs.py``.)
    """

    name: str
    summary: str
    lossless: bool
    make: Callable[..., Any]
    options: Mapping[str, str] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    kind: str = "speculative"
    default_policy: str = "cost"

    def check_options(self, options: Mapping[str, Any]) -> None:
        allowed = dict(self.options)
        if self.kind == "speculative":
            allowed.update(LOOP_OPTIONS)
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            listed = ", ".join(sorted(allowed)) or "none"
            raise TypeError(f"method {self.name!r} takes no option {', '.join(map(repr, unknown))} "
                            f"(its options: {listed})")
        missing = [o for o in self.required if options.get(o) is None]
        if missing:
            raise ValueError(f"method {self.name!r} needs {', '.join(f'{o}=...' for o in missing)}")


KINDS = ("autoregressive", "speculative", "generation")
_REGISTRY: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    """Add ``spec`` under ``spec.name`` (a second registration of a name is an error)."""
    if spec.kind not in KINDS:
        raise ValueError(f"method kind must be one of {KINDS}, got {spec.kind!r}")
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"a method named {spec.name!r} is already registered")
    _REGISTRY[spec.name] = spec
    return spec


# Modules of the methods shipped with the package; each registers itself on import.
BUILTIN_MODULES = ("specdec_cuda.proposers.draft_model", "specdec_cuda.diffusion_generate", "specdec_cuda.proposers.ngram",
                   "specdec_cuda.proposers.cross_tokenizer",
                   "specdec_cuda.proposers.lookahead", "specdec_cuda.proposers.dflash",
                   "specdec_cuda.proposers.ddtree", "specdec_cuda.proposers.quantspec",
                   "specdec_cuda.proposers.medusa", "specdec_cuda.proposers.mtp",
                   "specdec_cuda.proposers.layer_skip", "specdec_cuda.proposers.eagle3")


def _load_builtin() -> None:
    import importlib

    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def get(name: str) -> MethodSpec:
    """The method registered as ``name``; ValueError listing the registered names otherwise."""
    _load_builtin()
    if name not in _REGISTRY:
        raise ValueError(f"unknown method {name!r}; registered methods: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def available() -> list[MethodSpec]:
    """Every registered method, sorted by name."""
    _load_builtin()
    return [_REGISTRY[n] for n in sorted(_REGISTRY)]


def describe() -> str:
    """A table of the registered methods: name, lossless or lossy, summary, options."""
    lines = []
    for spec in available():
        status = "lossless" if spec.lossless else "LOSSY"
        lines.append(f"{spec.name:<16} {status:<9} {spec.summary}")
        options = dict(spec.options)
        if spec.kind == "speculative":
            options.update(LOOP_OPTIONS)
        for opt, text in options.items():
            need = " (required)" if opt in spec.required else ""
            lines.append(f"{'':<16} {'':<9}   {opt}{need}: {text}")
    return "\n".join(lines)


register(MethodSpec(
    name="autoregressive",
    summary="plain decoding: one target forward per token (the baseline every method is held to)",
    lossless=True,
    make=lambda target: None,
    kind="autoregressive",
))
