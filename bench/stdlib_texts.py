"""Training text for the real target's exit adapter and EAGLE-3 drafter: the Python standard
library's own modules (not HumanEval, not site-packages, not the stdlib's test suites), copied into
one folder for ``python -m specdec_cuda.train exit --data DIR --glob '*.py'`` (or ``eagle3``).

    python bench/stdlib_texts.py --out bench/results/stdlib-texts
"""

from __future__ import annotations

import argparse
import shutil
import sysconfig
from pathlib import Path

LEFT_OUT = {"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "turtledemo", "__pycache__"}


def stdlib_files(root: Path) -> list[Path]:
    """The stdlib's .py files under ``root``, sorted, without the folders of ``LEFT_OUT``."""
    return sorted(f for f in root.rglob("*.py") if not LEFT_OUT & set(f.relative_to(root).parts[:-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="folder to copy the files into (made again)")
    args = p.parse_args()
    root, out = Path(sysconfig.get_paths()["stdlib"]), Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    files = stdlib_files(root)
    for f in files:
        dest = out / f.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest)
    print(f"{len(files)} files, {sum(f.stat().st_size for f in files) / 1e6:.1f} MB from {root} -> {out}")


if __name__ == "__main__":
    main()
