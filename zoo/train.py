"""Train the zoo's models: ``python -m zoo.train [--zoo default|small|v4] [--heads | --dflash] ...``.

* plain: train (once) and cache the zoo pair; ``--force`` retrains; ``--ship`` then writes the
  bf16 copy committed to the repository (``zoo/<name>``). ``--zoo v4`` starts or resumes the
  long, checkpointed v4 run; ``--unlikelihood`` fine-tunes a finished v4 pair against greedy loops.
* ``--heads``: train the Medusa heads and MTP modules on the frozen target and cache them beside it.
* ``--dflash``: train the DFlash drafter of a target, cached beside it.

The diffusion LM has its own entry point, ``python -m zoo.diffusion``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from . import pairs


def _parser() -> argparse.ArgumentParser:
    zoo = argparse.ArgumentParser(prog="python -m zoo.train", description=__doc__.split("\n")[0])
    zoo.add_argument("--force", action="store_true", help="retrain even if cached")
    zoo.add_argument("--zoo", choices=("default", "small", "v4"), default="default",
                     help="v4: start or resume the long, checkpointed training run (hours)")
    zoo.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    zoo.add_argument("--ship", nargs="?", const="", default=None, metavar="DIR",
                     help="then write the pair as shipped in the repository (bf16 safetensors, tokenizer, "
                          "configs; <= 40 MB) to DIR (default: the checkout's zoo/<pair name>)")
    zoo.add_argument("--run-dir", default=None,
                     help="v4: checkpoints, log and data (default $SPECDEC_ZOO_V4_DIR or the checkout's .cache/zoo-v4-train)")
    zoo.add_argument("--unlikelihood", action="store_true",
                     help="v4: fine-tune the finished pair (the shipped one, else the trained cache) against greedy "
                          "loops and distil its draft again (about 22 minutes on one core; zoo.v4.refine_pair; a pair "
                          "refined already gets another round); the "
                          "result goes to RUN_DIR/unlikelihood and the zoo cache, and with --ship to the repository "
                          "(then retrain the heads and the DFlash drafter: shipping replaces the pair's folder)")
    zoo.add_argument("--dflash", action="store_true",
                     help="train (once) the DFlash drafter of --target (default: the zoo target), cached beside it")
    zoo.add_argument("--target", default=None, help="--dflash / --heads: the target checkpoint folder (default: the zoo target)")
    zoo.add_argument("--heads", action="store_true",
                     help="train Medusa heads and MTP modules on the frozen zoo target (or --target) and cache "
                          "them beside it (heads-medusa, heads-mtp); --force retrains")

    return zoo


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
        if args.threads == 1:  # the tokenizer's Rust thread pool too (read when it first starts)
            os.environ.setdefault("RAYON_NUM_THREADS", "1")
    try:
        if args.heads:
            return _heads(args)
        if args.dflash:
            from . import dflash as zoo_dflash

            zoo_dflash.train_dflash(args.target, force=args.force)
            return 0
        spec = pairs.SPECS[args.zoo]
        if args.zoo == "v4":
            from . import v4 as zoo_v4

            run_dir = Path(args.run_dir) if args.run_dir else zoo_v4.default_run_dir()
            if args.force:
                print("error: --force does not apply to v4 (delete its run folder to restart)", file=sys.stderr)
                return 2
            if args.unlikelihood:
                source = next((p / spec.name for p in (pairs.shipped_root(), pairs.zoo_root())
                               if p is not None and (p / spec.name / "report.json").is_file()), None)
                if source is None:
                    print("error: no finished v4 pair to refine (shipped or cached)", file=sys.stderr)
                    return 2
                result = zoo_v4.refine_pair(source, run_dir / "unlikelihood", spec)
                zoo_v4.copy_export(run_dir / "unlikelihood" / "export", pairs.zoo_root() / spec.name)
            else:
                try:
                    result = zoo_v4.train_v4(run_dir, spec, export_to=pairs.zoo_root() / spec.name)
                except RuntimeError as exc:  # the run folder is locked by a running process
                    print(f"error: {exc}", file=sys.stderr)
                    return 2
            if "target_heldout" not in result:
                print(f"interrupted at {result['phase']} step {result['step']}; run the same command to resume")
                return 0
        elif args.force:
            shutil.rmtree(pairs.zoo_root() / spec.name, ignore_errors=True)
        target, draft = pairs.get_pair(spec, use_shipped=args.ship is None)  # ship from the trained copy
        report = pairs.report(spec, root=target.parent.parent)
        print(f"target: {target}\ndraft:  {draft}\n"
              f"draft/target greedy agreement {100 * report['agreement']['greedy']:.1f}%, "
              f"expected acceptance at T=1 {100 * report['agreement']['sampled']:.1f}%")
        if args.ship is not None:
            dest = Path(args.ship) if args.ship else (pairs.shipped_root() or Path("zoo")) / spec.name
            shipped = pairs.ship_pair(target.parent, dest)
            print(f"shipped to {dest}: {shipped['dtype']}, {sum(shipped['bytes'].values()) / 1e6:.1f} MB of models")
        return 0
    except (FileNotFoundError, ValueError) as exc:  # bad folders, unknown families (UnsupportedModelError)
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _heads(args) -> int:
    """``--heads``: train (once) and cache both head sets beside the target folder."""
    from . import heads as zoo_heads

    target = Path(args.target) if args.target else pairs.get_pair(pairs.SPECS[args.zoo])[0]
    cached = all((target.parent / f"heads-{kind}" / "config.json").is_file() for kind in ("medusa", "mtp"))
    if cached and not args.force:
        print(f"heads cached beside {target} (heads-medusa, heads-mtp); --force retrains")
        return 0
    zoo_heads.train_heads(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
