"""Runs every bench/bench_*.py in --quick mode, one after another, JSON into bench/results/.

    python bench/run_all.py [--full] [--only NAME ...]

Each benchmark prints its own table; this script reports which ones ran and how long they took.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="full sweeps instead of --quick")
    parser.add_argument("--only", nargs="*", default=None, help="bench names, e.g. sampling tree")
    args = parser.parse_args()
    results_dir = os.path.join(HERE, "results")
    os.makedirs(results_dir, exist_ok=True)
    scripts = sorted(glob.glob(os.path.join(HERE, "bench_*.py")))
    summary = []
    for script in scripts:
        name = os.path.basename(script)[len("bench_"):-len(".py")]
        if args.only and name not in args.only:
            continue
        cmd = [sys.executable, script, "--out", os.path.join(results_dir, f"{name}.json")]
        if not args.full:
            cmd.append("--quick")
        print(f"==== bench {name}: {' '.join(cmd)}", flush=True)
        start = time.perf_counter()
        rc = subprocess.call(cmd)
        summary.append((name, rc, time.perf_counter() - start))
    print("\n| bench | exit | seconds |\n|---|---|---|")
    for name, rc, seconds in summary:
        print(f"| {name} | {rc} | {seconds:.1f} |")
    return max((rc != 0 for _, rc, _ in summary), default=0)


if __name__ == "__main__":
    sys.exit(main())
