"""Command line: ``python -m specdec_cuda {demo,bench,zoo,methods}``.

* ``demo``: the zoo pair (the shipped one, else trained the first time) or ``--target`` /
  ``--draft`` HF checkpoint folders; a few prompts decoded autoregressively and speculatively,
  greedy and sampled; the text, and a table of tokens/s, tau, speedup and whether greedy outputs were identical.
* ``bench``: the end-to-end benchmark (also ``python bench/bench_e2e.py``).
* ``zoo``: train (once) and cache the zoo pair; ``--force`` retrains; ``--ship`` then writes the
  bf16 copy committed to the repository (``zoo/<name>``). ``zoo --heads``: train the Medusa heads
  and MTP modules on the frozen target and cache them beside it.
* ``methods``: the registered decoding methods, lossless or lossy, with their options.
"""

from __future__ import annotations

import argparse
import os
import shutil
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

    zoo = sub.add_parser("zoo", help="train and cache the zoo target/draft pair")
    zoo.add_argument("--force", action="store_true", help="retrain even if cached")
    zoo.add_argument("--zoo", choices=("default", "small", "v4"), default="default",
                     help="v4: start or resume the long, checkpointed training run (hours)")
    zoo.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    zoo.add_argument("--ship", nargs="?", const="", default=None, metavar="DIR",
                     help="then write the pair as shipped in the repository (bf16 safetensors, tokenizer, "
                          "configs; <= 40 MB) to DIR (default: <repo>/zoo/<pair name>)")
    zoo.add_argument("--run-dir", default=None,
                     help="v4: checkpoints, log and data (default $SPECDEC_ZOO_V4_DIR or /work/zoo-v4-train)")
    zoo.add_argument("--unlikelihood", action="store_true",
                     help="v4: fine-tune the finished pair (the shipped one, else the trained cache) against greedy "
                          "loops and distil its draft again (about 22 minutes on one core; zoo_v4.refine_pair; a pair "
                          "refined already gets another round); the "
                          "result goes to RUN_DIR/unlikelihood and the zoo cache, and with --ship to the repository "
                          "(then retrain the heads and the DFlash drafter: shipping replaces the pair's folder)")
    zoo.add_argument("--dflash", action="store_true",
                     help="train (once) the DFlash drafter of --target (default: the zoo target), cached beside it")
    zoo.add_argument("--target", default=None, help="--dflash / --heads: the target checkpoint folder (default: the zoo target)")
    zoo.add_argument("--heads", action="store_true",
                     help="train Medusa heads and MTP modules on the frozen zoo target (or --target) and cache "
                          "them beside it (heads-medusa, heads-mtp); --force retrains")

    sub.add_parser("methods", help="list the registered decoding methods and their options")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("demo", "bench") and args.draft and not args.target:
        print("error: --draft needs --target", file=sys.stderr)
        return 2
    if args.command == "methods":
        from . import methods

        print(methods.describe())
        return 0
    from . import e2e, zoo

    if args.command in ("demo", "bench") and args.zoo is None:
        args.zoo = zoo.default_zoo()
    if args.command == "zoo" and args.threads:
        import torch

        torch.set_num_threads(args.threads)
        if args.threads == 1:  # the tokenizer's Rust thread pool too (read when it first starts)
            os.environ.setdefault("RAYON_NUM_THREADS", "1")
    try:
        if args.command == "zoo" and args.heads:
            return _zoo_heads(args)
        if args.command == "demo":
            return e2e.demo(args)
        if args.command == "bench":
            return e2e.bench(args)
        if args.dflash:
            from . import zoo_dflash

            zoo_dflash.train_dflash(args.target, force=args.force)
            return 0
        spec = zoo.SPECS[args.zoo]
        if args.zoo == "v4":
            from . import zoo_v4

            run_dir = Path(args.run_dir) if args.run_dir else zoo_v4.default_run_dir()
            if args.force:
                print("error: --force does not apply to v4 (delete its run folder to restart)", file=sys.stderr)
                return 2
            if args.unlikelihood:
                source = next((p / spec.name for p in (zoo.shipped_root(), zoo.zoo_root())
                               if p is not None and (p / spec.name / "report.json").is_file()), None)
                if source is None:
                    print("error: no finished v4 pair to refine (shipped or cached)", file=sys.stderr)
                    return 2
                result = zoo_v4.refine_pair(source, run_dir / "unlikelihood", spec)
                zoo_v4.copy_export(run_dir / "unlikelihood" / "export", zoo.zoo_root() / spec.name)
            else:
                try:
                    result = zoo_v4.train_v4(run_dir, spec, export_to=zoo.zoo_root() / spec.name)
                except RuntimeError as exc:  # the run folder is locked by a running process
                    print(f"error: {exc}", file=sys.stderr)
                    return 2
            if "target_heldout" not in result:
                print(f"interrupted at {result['phase']} step {result['step']}; run the same command to resume")
                return 0
        elif args.force:
            shutil.rmtree(zoo.zoo_root() / spec.name, ignore_errors=True)
        target, draft = zoo.get_pair(spec, use_shipped=args.ship is None)  # ship from the trained copy
        report = zoo.report(spec, root=target.parent.parent)
        print(f"target: {target}\ndraft:  {draft}\n"
              f"draft/target greedy agreement {100 * report['agreement']['greedy']:.1f}%, "
              f"expected acceptance at T=1 {100 * report['agreement']['sampled']:.1f}%")
        if args.ship is not None:
            dest = Path(args.ship) if args.ship else (zoo.shipped_root() or Path("zoo")) / spec.name
            shipped = zoo.ship_pair(target.parent, dest)
            print(f"shipped to {dest}: {shipped['dtype']}, {sum(shipped['bytes'].values()) / 1e6:.1f} MB of models")
        return 0
    except (FileNotFoundError, ValueError) as exc:  # bad folders, unknown families (UnsupportedModelError)
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _zoo_heads(args) -> int:
    """``zoo --heads``: train (once) and cache both head sets beside the target folder."""
    from . import zoo, zoo_heads

    target = Path(args.target) if args.target else zoo.get_pair(zoo.SPECS[args.zoo])[0]
    cached = all((target.parent / f"heads-{kind}" / "config.json").is_file() for kind in ("medusa", "mtp"))
    if cached and not args.force:
        print(f"heads cached beside {target} (heads-medusa, heads-mtp); --force retrains")
        return 0
    zoo_heads.train_heads(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
