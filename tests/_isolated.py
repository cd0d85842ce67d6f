"""Run risky inputs in a child interpreter, so that a crash (a segfault, an abort, heap corruption
caught by the allocator) fails the calling test instead of killing the pytest process.

The child runs ``script`` with ``python/`` on its path and one intra-op thread. Scripts report each
case on its own line; :func:`run_isolated` returns those lines and fails with the child's stderr
(and the last case it started, which is the one that crashed) when it does not exit cleanly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Prepended to every child script: `case(name, fn)` runs fn and prints one JSON line per case with
# the outcome ("ok", or the exception type and message). "start" lines are flushed before the call,
# so the last one names the case that crashed the process.
PRELUDE = '''
import json, sys, traceback
import torch
torch.set_num_threads(1)
import specdec_cuda.ops as ops

def case(name, fn):
    print(json.dumps({"start": name}), flush=True)
    try:
        result = fn()
    except Exception as exc:  # the outcome under test: which exception, with what message
        print(json.dumps({"case": name, "raised": type(exc).__name__, "message": str(exc)[:400]}),
              flush=True)
        return
    print(json.dumps({"case": name, "raised": None, "result": result}), flush=True)
'''


def run_isolated(script: str, timeout: float = 300) -> list[dict]:
    """Run ``PRELUDE + script`` in a child process; return its case records (one dict per case).

    Fails (AssertionError) when the child does not exit with status 0: a crash, an uncaught error
    outside `case`, or a timeout, naming the last case it started.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "python"))
    code = PRELUDE + textwrap.dedent(script)
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"child timed out after {timeout}s; last output:\n{(exc.stdout or '')[-2000:]}")
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0:
        started = [r["start"] for r in records if "start" in r]
        last = started[-1] if started else "<none>"
        raise AssertionError(f"child exited with status {proc.returncode} (negative: killed by signal) "
                             f"during case {last!r}\nstderr:\n{proc.stderr[-4000:]}")
    return [r for r in records if "case" in r]


def run_capped(cap: str, code: str, payload=None, timeout: float = 120, env: dict | None = None):
    """Run ``python -c code`` in a fresh process with ``SPECDEC_CPU_ISA=cap`` (the kernels read it
    once, at load), the checkout's ``python/`` first on its path and ``env``'s variables besides; a
    non-zero exit fails the test.

    With ``payload``: it is ``torch.save``d to a file whose path the child gets as ``sys.argv[1]``;
    the child writes its result over it, and that result is returned.
    """
    import tempfile

    import torch

    env = dict(os.environ, **(env or {}), SPECDEC_CPU_ISA=cap,
               PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
    if payload is None:
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=timeout)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "io.pt")
        torch.save(payload, path)
        subprocess.run([sys.executable, "-c", code, path], env=env, check=True, timeout=timeout)
        return torch.load(path)
