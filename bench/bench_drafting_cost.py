"""What drafting costs, per method, against the target step it tries to save: batch 1, greedy,
every method always drafting (``policy="fixed"``, its default draft length), held-out prompts.

    python bench/bench_drafting_cost.py [--pairs zoo real] [--methods M ...] [--max-new-tokens N] [--repeats R]

Per method, from the run's own metrics (``e2e.combine``), each as a multiple of the autoregressive
run's mean decoding step (one target forward of one token, measured in the same round), the median
over ``--repeats`` rounds of autoregressive decoding then every method:

* ``draft / step``: the proposer's time per drafted token (``(propose_seconds + accept_seconds) /
  drafted``: the drafter's forwards, its cache fed the accepted path after each step, a draft
  model's catch-up with the prompt included, host work);
* ``propose`` / ``accept``: the proposer's ``propose`` and ``accept`` per decoding step (a block,
  for DFlash / DDTree, which draft one per step), in target steps; ``block`` is ``propose`` less its
  one-time part ``prefill`` (``Metrics.one_time_seconds``: a drafter's prefill of the prompt, spread
  over the steps here), as the target's step leaves out the target's own prefill;
* ``verify / step``: the method's mean target forward (a verification of its typical draft, extra
  rows such as lookahead's window included);
* ``tau``: tokens per target forward. Drafting pays at batch 1 roughly when
  ``verify / step + draft / step * drafted per step < tau``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: zoo/, bench/

import torch  # noqa: E402

from bench import e2e  # noqa: E402
from bench.bench_policy import grid_decoders  # noqa: E402
from specdec_cuda import SpeculativeDecoder  # noqa: E402


def costs(pair, prompts: list[list[int]], max_new: int, real: bool, only, repeats: int = 1) -> list[dict]:
    """One row per method: each figure the median over ``repeats`` rounds, a round running
    autoregressive decoding then every method on the same prompts (a round's ratios are taken to
    its own autoregressive step, so a machine whose speed drifts between rounds moves both sides)."""
    decoders, _ = grid_decoders(pair, real=real)
    eos = pair.tokenizer.eos_token_id
    runs = {"autoregressive": SpeculativeDecoder(pair.target), **{m: f for m, (_, f) in decoders.items()
                                                                  if not only or m in only}}
    common = dict(max_new_tokens=max_new, eos_token_id=eos)
    for decoder in runs.values():  # first-call allocations
        decoder.generate(prompts[-1:], **common)
    rounds, steps = [], []
    for _ in range(repeats):
        results = {name: e2e.combine([e2e.engine_group(d, [p], **common) for p in prompts[:-1]])
                   for name, d in runs.items()}
        step = results["autoregressive"]["step_seconds"]
        steps.append(step)
        rounds.append([_row(name, r, results["autoregressive"], step) for name, r in results.items()
                       if name != "autoregressive"])
    rows = [dict(method=first["method"], identical=all(r[i]["identical"] for r in rounds),
                 **{key: statistics.median(r[i][key] for r in rounds)
                    for key, value in first.items() if isinstance(value, float)})
            for i, first in enumerate(rounds[0])]
    step = statistics.median(steps)
    spread = f" (rounds {1e3 * min(steps):.2f}-{1e3 * max(steps):.2f}, medians of {repeats})" if repeats > 1 else ""
    print(f"\nautoregressive step: {1e3 * step:.2f} ms{spread}")
    print(f"{'method':16s} {'draft/step':>10s} {'propose':>8s} {'prefill':>8s} {'block':>6s} {'accept':>7s} "
          f"{'verify/step':>11s} {'tau':>5s} {'drafted/step':>12s} {'speedup':>8s} {'same':>5s}")
    for r in rows:
        print(f"{r['method']:16s} {r['draft_per_step_share']:10.2f} {r['propose_per_step']:8.2f} "
              f"{r['prefill_per_step']:8.2f} {r['propose_per_step'] - r['prefill_per_step']:6.2f} "
              f"{r['accept_per_step']:7.2f} {r['verify_per_step']:11.2f} {r['tau']:5.2f} "
              f"{r['drafted_per_step'] or 0:12.2f} {r['speedup']:7.2f}x {'yes' if r['identical'] else 'NO':>5s}")
    return rows


def _row(name: str, r: dict, ar: dict, step: float) -> dict:
    """A method's figures in one round, as multiples of that round's autoregressive step."""
    drafted_per_step = r["tau"] and (r["acceptance"] and (r["tau"] - 1) / r["acceptance"])
    return dict(method=name, draft_per_step_share=(r["draft_seconds_per_token"] or 0.0) / step,
                propose_per_step=r["propose_seconds_per_step"] / step,
                prefill_per_step=r["one_time_seconds_per_step"] / step,
                accept_per_step=r["accept_seconds_per_step"] / step,
                verify_per_step=r["step_seconds"] / step, tau=float(r["tau"]), acceptance=r["acceptance"],
                drafted_per_step=drafted_per_step and float(drafted_per_step), speedup=ar["seconds"] / r["seconds"],
                identical=r["outputs"] == ar["outputs"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="*", choices=("zoo", "real"), default=["zoo"])
    parser.add_argument("--methods", nargs="*", default=None)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5,
                        help="rounds (autoregressive decoding, then every method); each figure the median")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on the zoo pair")
    parser.add_argument("--real-threads", type=int, default=2)
    args = parser.parse_args()
    os.environ["SPECDEC_POLICY_CACHE"] = tempfile.mkdtemp(prefix="specdec-drafting-cost-")
    if "zoo" in args.pairs:
        pair = e2e.load_pair(threads=args.threads)
        print("zoo pair, batch 1, greedy, 4 held-out openings")
        costs(pair, e2e.encode(pair.tokenizer, e2e.held_out_prompts(5)), args.max_new_tokens, False, args.methods,
              args.repeats)
    if "real" in args.pairs:
        from bench import bench_real, humaneval

        torch.set_num_threads(args.real_threads)
        real = bench_real.load_real_pair(argparse.Namespace(target=None, draft=None, pair="qwen2.5-coder",
                                                            weights="gguf", dtype="bfloat16"))
        print("real pair (GGUF), batch 1, greedy, 2 HumanEval held-out prompts")
        prompts = [p.token_ids for p in humaneval.prompts("chat", "heldout", real.tokenizer)[:3]]
        costs(real, prompts, args.max_new_tokens, True, args.methods, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
