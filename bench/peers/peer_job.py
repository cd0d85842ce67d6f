"""The command line both peer runners share (llama_cpp_peer.py, vllm_peer.py): read a job JSON
(a file, or - for standard input), run it, write the result JSON (``--out``, else standard output).

Standard library only: the runners run in their own virtual environments (.venv-llamacpp,
.venv-vllm), which have neither torch nor this project; they are run as scripts, so this file,
beside them, is importable as ``peer_job``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable


def parse_mode(mode: str, kinds: tuple[str, ...]) -> tuple[str, int | None]:
    """A runner's mode: ``"plain"`` -> ("plain", None); ``"<kind>:<K>"`` -> (kind, K) for a kind of
    ``kinds`` (the runner's speculative modes) and K >= 1; ValueError for anything else."""
    kind, _, arg = mode.partition(":")
    if kind == "plain" and not arg:
        return kind, None
    if kind in kinds and arg.isdigit() and int(arg) >= 1:
        return kind, int(arg)
    expected = ", ".join(["plain"] + [f"{k}:K" for k in kinds])
    raise ValueError(f"unknown mode {mode!r}: expected {expected} (K >= 1)")


def job_main(run: Callable[[dict], dict], description: str, argv=None) -> int:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("job", help="the job JSON file, or - for standard input")
    p.add_argument("--out", help="write the result JSON here (default: standard output)")
    args = p.parse_args(argv)
    job = json.load(sys.stdin if args.job == "-" else open(args.job))
    text = json.dumps(run(job))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0
