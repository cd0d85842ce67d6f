"""llama.cpp as a peer of the real bench: its job, its subprocess, its rows.

The runner itself (``llama_cpp_peer.py``) runs in the private environment ``.venv-llamacpp``
(``make llama-cpp-env``); this module runs in the project's and imports nothing of it. On the same
GGUF files this engine reads and the same prompt token ids, llama.cpp decodes greedily at batch 1 in
five modes (``MODES``: plain, prompt lookup of 10, 32 and 2 tokens, the draft), and each becomes a
bench row: tokens/s, its ratio to this engine's autoregressive row, and the share of positions
where its tokens equal that row's (different numerics: a figure to read, not a check).

Standalone, for a quick measurement without the project's methods::

    python -m bench.peers.llama_cpp_rows [--split heldout] [--prompts 2] [--max-new-tokens 64] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-llamacpp"
RUNNER = Path(__file__).resolve().parent / "llama_cpp_peer.py"
# The runner's modes the bench asks for (see llama_cpp_peer.py); draft:K only with a draft GGUF.
MODES = ("plain", "prompt_lookup:10", "prompt_lookup:32", "prompt_lookup:2", "draft:4")
BASELINE = "llama.cpp plain"


def row_name(mode: str, draft_label: str = "") -> str:
    """``prompt_lookup:10`` -> ``llama.cpp prompt_lookup n=10``; ``draft:4`` -> ``llama.cpp draft 0.5B k=4``."""
    kind, _, n = mode.partition(":")
    if kind == "prompt_lookup":
        return f"llama.cpp prompt_lookup n={n}"
    if kind == "draft":
        return " ".join(["llama.cpp draft", *([draft_label] if draft_label else []), f"k={n}"])
    return f"llama.cpp {mode}"


def python(venv: Path = VENV) -> Path:
    """The private environment's interpreter; FileNotFoundError saying how to build it."""
    exe = venv / "bin" / "python"
    if not exe.exists():
        raise FileNotFoundError(f"the llama.cpp peer needs its own environment, {venv}, which is missing: "
                                f"run `make llama-cpp-env` (builds llama-cpp-python from source, several minutes)")
    return exe


def gguf_of(folder: Path | None) -> Path | None:
    """``folder/model.gguf`` (the file the model cache keeps beside the HF folder), None without one."""
    path = Path(folder) / "model.gguf" if folder is not None else None
    return path if path is not None and path.exists() else None


def size_label(folder: Path) -> str:
    """``qwen2.5-coder-0.5b`` -> ``0.5B``; the folder's name when it ends in no size."""
    m = re.search(r"-(\d+(?:\.\d+)?)b$", Path(folder).name.lower())
    return f"{m.group(1)}B" if m else Path(folder).name


def run_peer(job: dict, venv: Path = VENV, timeout: float | None = None) -> dict:
    """Run the peer runner on ``job`` in ``venv``; its result. Its log goes to this stderr. A run that
    dies of a signal is run again without llama.cpp's extra buffer types (the runner's
    ``extra_buffers``; its AMX weight repacking crashed on an AMX machine), and the result says so
    (``retried``); RuntimeError when that fails too, or for any other failure."""
    exe = python(venv)
    with tempfile.TemporaryDirectory(prefix="llama_cpp_peer_") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        proc = subprocess.run([str(exe), str(RUNNER), str(job_path), "--out", str(out_path)],
                              stdout=sys.stderr, timeout=timeout)
        if proc.returncode < 0 and job.get("extra_buffers", True):
            print(f"[llama.cpp peer] the runner died of signal {-proc.returncode}; again without llama.cpp's extra "
                  f"buffer types (weight repacking, e.g. AMX)", file=sys.stderr, flush=True)
            result = run_peer(dict(job, extra_buffers=False), venv, timeout)
            result["retried"] = f"the first run died of signal {-proc.returncode} with llama.cpp's extra buffer types"
            return result
        if proc.returncode != 0:
            raise RuntimeError(f"the llama.cpp peer failed (exit {proc.returncode}); see its messages above")
        return json.loads(out_path.read_text())


def agreement(peer: list[list[int]], engine: list[list[int]]) -> dict:
    """Position-wise agreement of two sets of greedy continuations, prompt by prompt.

    ``positions``: equal tokens at the same position over all positions of the longer of each pair;
    ``prefix``: the mean over prompts of the common prefix's share of the longer continuation
    (greedy continuations that part once rarely meet again, so this is the truer figure).
    """
    same = total = 0
    prefixes = []
    for a, b in zip(peer, engine, strict=True):
        longest = max(len(a), len(b))
        equal = [x == y for x, y in zip(a, b)]
        same, total = same + sum(equal), total + longest
        common = equal.index(False) if False in equal else len(equal)
        prefixes.append(common / longest if longest else 1.0)
    return dict(positions=same / total if total else 1.0, prefix=sum(prefixes) / len(prefixes) if prefixes else 1.0)


def job(target_gguf: Path, draft_gguf: Path | None, prompts: list[list[int]], max_new_tokens: int,
        eos_token_ids: list[int], threads: int, temperature: float = 0.0, seed: int = 0) -> dict:
    """The runner's job: every mode of ``MODES`` (the draft one only with a draft GGUF), greedy or
    sampled at ``temperature`` (seed ``seed + i`` for prompt i)."""
    modes = [m for m in MODES if draft_gguf is not None or not m.startswith("draft:")]
    return dict(model=str(target_gguf), draft_model=str(draft_gguf) if draft_gguf else None, prompts=prompts,
                max_new_tokens=max_new_tokens, eos_token_ids=list(eos_token_ids), n_threads=threads, modes=modes,
                temperature=float(temperature), seed=int(seed))


def bench_rows(result: dict, workloads: dict[str, list[list[int]]], engine_ar: dict[str, dict],
               draft_label: str = "") -> list[dict]:
    """Rows in bench/bench_real.py's shape from one runner result on the concatenated ``workloads``.

    ``engine_ar``: per workload, this engine's autoregressive result at batch 1 and the run's
    temperature (its ``tokens_per_s`` and ``outputs``). Greedy runs only: ``identical``, whether the
    row's tokens are llama.cpp plain's (its own baseline), and ``agreement`` (see ``agreement``)
    with this engine's autoregressive tokens; a sampled run's rows have None for both (different
    draws), and ``lossless`` None (llama-cpp-python's sample-and-match keeps the distribution by
    construction; not checked here).
    """
    temperature = float(result.get("temperature", 0.0))
    greedy = temperature == 0
    rows, start = [], 0
    for w, prompts in workloads.items():
        stop = start + len(prompts)
        plain = [p["new_tokens"] for p in result["modes"]["plain"]["prompts"][start:stop]]
        for mode, summary in result["modes"].items():
            part = summary["prompts"][start:stop]
            outputs = [p["new_tokens"] for p in part]
            tokens, seconds = sum(map(len, outputs)), sum(p["seconds"] for p in part)
            forwards = sum(p.get("target_forwards", 0) for p in part)
            drafted = sum(p.get("drafted", 0) for p in part)
            per_row = [a == b for a, b in zip(outputs, plain)]
            tps = tokens / seconds if seconds > 0 else 0.0
            rows.append(dict(workload=w, split=w, batch=1, temperature=temperature, system="llama.cpp",
                             method=row_name(mode, draft_label),
                             lossless=True if greedy else None, baseline=BASELINE, tokens=tokens, seconds=seconds,
                             tokens_per_s=tps,
                             prefill_seconds=sum(p["prefill_seconds"] for p in part),
                             tau=(tokens - len(part)) / forwards if forwards else None,
                             acceptance=None, drafted=drafted,
                             vs_engine_ar=tps / engine_ar[w]["tokens_per_s"] if w in engine_ar else None,
                             identical=all(per_row) if greedy else None, identical_rows=per_row if greedy else None,
                             agreement=(agreement(outputs, engine_ar[w]["outputs"]) if greedy and w in engine_ar
                                        else None),
                             extra_buffers=result.get("extra_buffers", True), retried=result.get("retried")))
        start = stop
    return rows


def print_rows(rows: list[dict], header: str = "") -> None:
    """The peer rows with what the bench's table has no column for: agreement with this engine."""
    width = max(len(r["method"]) for r in rows)
    head = (f"{'workload':10s} {'method':{width}s} {'T':>4s} {'tokens/s':>9s} {'tau':>5s} {'vs AR':>6s} "
            f"{'= plain':>7s} {'= engine AR (positions / prefix)':>33s}")
    print(("\n" + header if header else "") + "\n" + head + "\n" + "-" * len(head))
    for r in rows:
        tau = f"{r['tau']:.2f}" if r.get("tau") else "-"
        vs = f"{r['vs_engine_ar']:5.2f}x" if r.get("vs_engine_ar") is not None else "-"
        agree = (f"{100 * r['agreement']['positions']:.0f}% / {100 * r['agreement']['prefix']:.0f}%"
                 if r.get("agreement") else "-")
        same = {True: "yes", False: "NO", None: "-"}[r.get("identical")]  # None: a sampled row
        print(f"{r['workload']:10s} {r['method']:{width}s} {r.get('temperature', 0.0):4g} {r['tokens_per_s']:9.1f} "
              f"{tau:>5s} {vs:>6s} {same:>7s} {agree:>33s}")


def standalone_parser(description: str, target_help: str) -> argparse.ArgumentParser:
    """The options of a peer measured alone (``main`` here and in vllm_rows.py): the pair from the
    model cache, HumanEval prompts of one half, tokens and threads."""
    sys.path.insert(0, str(ROOT / "python"))
    sys.path.insert(0, str(ROOT))
    from bench import humaneval

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help=target_help)
    p.add_argument("--draft", default="qwen2.5-coder-0.5b", help="the draft's model cache name ('' for none)")
    p.add_argument("--kind", choices=humaneval.KINDS, default="chat")
    p.add_argument("--split", choices=humaneval.SPLITS, default="heldout")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    return p


def standalone_prompts(args) -> tuple[Path, Path | None, list[int], list[list[int]]]:
    """(target folder, draft folder or None, EOS ids, prompt token ids) for ``standalone_parser``'s
    options."""
    from transformers import AutoTokenizer

    from bench import humaneval
    from specdec_cuda import models

    target_dir = models.model_path(args.target, fetch_if_missing=False)
    draft_dir = models.model_path(args.draft, fetch_if_missing=False) if args.draft else None
    tok = AutoTokenizer.from_pretrained(target_dir)
    eos = json.loads((target_dir / "generation_config.json").read_text())["eos_token_id"]
    eos = eos if isinstance(eos, list) else [eos]
    prompts = [q.token_ids for q in humaneval.prompts(args.kind, args.split, tokenizer=tok)[: args.prompts]]
    return target_dir, draft_dir, eos, prompts


def main(argv=None) -> int:
    """Measure llama.cpp alone on HumanEval prompts of the real pair (no engine rows: no vs AR)."""
    p = standalone_parser(main.__doc__, "a model cache name (its model.gguf)")
    p.add_argument("--out", help="also write the runner's result JSON here")
    args = p.parse_args(argv)
    target_dir, draft_dir, eos, prompts = standalone_prompts(args)
    result = run_peer(job(gguf_of(target_dir), gguf_of(draft_dir), prompts, args.max_new_tokens, eos, args.threads))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    rows = bench_rows(result, {args.split: prompts}, {}, size_label(draft_dir) if draft_dir else "")
    print_rows(rows, f"llama-cpp-python {result['llama_cpp_python']}, {args.threads} threads, {len(prompts)} "
                     f"HumanEval {args.kind} prompts ({args.split}), {args.max_new_tokens} new tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
