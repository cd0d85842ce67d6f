"""The bench side of the vLLM and transformers peers (bench/peers/vllm_rows.py, transformers_rows.py),
without vLLM: jobs, the runner's JSON, rows and their agreement, the failure paths (no environment,
a runner that dies, an engine that cannot run), transformers' rows on a tiny random pair, and the
llama.cpp runner's retry without extra buffer types (bench/peers/llama_cpp_rows.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest

from bench.peers import transformers_rows, vllm_rows


def _result(mode, outputs, seconds=1.0, **extra):
    prompts = [dict(new_tokens=o, seconds=seconds, prefill_seconds=0.1, tokens_per_s=len(o) / seconds, **extra)
               for o in outputs]
    return dict(peer="vllm", mode=mode, vllm="0.32.0", startup_seconds=12.0, prompts=prompts)


def test_vllm_jobs_and_row_names():
    jobs = vllm_rows.jobs(Path("/t"), None, [[1, 2]], 8, [0], 2)
    assert [j["mode"] for j in jobs] == ["plain", "ngram:4", "ngram:32"]  # no draft folder: no draft mode
    jobs = vllm_rows.jobs(Path("/t"), Path("/d"), [[1, 2]], 8, [0], 2)
    assert [j["mode"] for j in jobs] == list(vllm_rows.MODES)
    assert all(j["draft_model"] == "/d" and j["threads"] == 2 and j["prompts"] == [[1, 2]] for j in jobs)
    assert [vllm_rows.row_name(m, "0.5B") for m in vllm_rows.MODES] == ["vLLM plain", "vLLM ngram k=4",
                                                                        "vLLM ngram k=32", "vLLM draft 0.5B k=4"]


def test_vllm_parse_result_checks_its_shape():
    good = _result("plain", [[1, 2]])
    assert vllm_rows.parse_result(json.dumps(good), "plain") == good
    failed = dict(peer="vllm", mode="draft:4", error="NotImplementedError: no")
    assert vllm_rows.parse_result(json.dumps(failed), "draft:4")["error"].startswith("NotImplementedError")
    for bad in ("not json", json.dumps([1]), json.dumps(dict(peer="vllm", mode="plain")),
                json.dumps(dict(peer="vllm", mode="plain", prompts=[dict(new_tokens=[1])]))):
        with pytest.raises(ValueError, match="vLLM peer"):
            vllm_rows.parse_result(bad, "plain")


def test_vllm_bench_rows_split_workloads_and_report_failures():
    workloads = {"bench": [[1], [2]], "heldout": [[3]]}
    engine = {("bench", 0.0): dict(tokens_per_s=2.0, outputs=[[5, 6, 7], [8, 9]]),
              ("heldout", 0.0): dict(tokens_per_s=4.0, outputs=[[1, 2, 3, 4]])}
    plain = _result("plain", [[5, 6, 7], [8, 9], [1, 2, 0, 0]])
    ngram = _result("ngram:4", [[5, 6, 7], [8, 0], [1, 2, 0, 0]], seconds=0.5, drafts=2, draft_tokens=8, accepted=4)
    failed = dict(peer="vllm", mode="draft:4", error="RuntimeError: boom")
    rows, not_benched = vllm_rows.bench_rows([plain, ngram, failed], workloads, engine, "0.5B")
    assert not_benched == {"vLLM draft 0.5B k=4": "RuntimeError: boom"}
    by = {(r["workload"], r["method"]): r for r in rows}
    assert set(by) == {(w, m) for w in workloads for m in ("vLLM plain", "vLLM ngram k=4")}
    r = by["bench", "vLLM plain"]
    assert r["tokens"] == 5 and r["tokens_per_s"] == pytest.approx(2.5) and r["vs_engine_ar"] == pytest.approx(1.25)
    assert r["identical"] and r["agreement"] == dict(positions=1.0, prefix=1.0) and r["startup_seconds"] == 12.0
    r = by["bench", "vLLM ngram k=4"]
    assert r["identical_rows"] == [True, False] and r["tau"] == pytest.approx(1 + 8 / 4)
    assert r["acceptance"] == pytest.approx(0.5) and r["agreement"]["positions"] == pytest.approx(4 / 5)
    r = by["heldout", "vLLM ngram k=4"]
    assert r["agreement"] == dict(positions=0.5, prefix=0.5) and r["vs_engine_ar"] == pytest.approx(2.0)
    vllm_rows.print_rows(rows, not_benched, "header")  # prints without a column it cannot fill


def test_vllm_sampled_rows_compare_with_the_sampled_engine_row_and_claim_no_identity():
    workloads = {"heldout": [[1], [2]]}
    engine = {("heldout", 0.0): dict(tokens_per_s=1.0, outputs=[[5], [6]]),
              ("heldout", 0.8): dict(tokens_per_s=4.0, outputs=[[7, 8], [9]])}
    results = [dict(_result(mode, [[5], [6]]), temperature=t) for t in (0.0, 0.8) for mode in ("plain", "ngram:4")]
    rows, failed = vllm_rows.bench_rows(results, workloads, engine)
    assert not failed
    by = {(r["method"], r["temperature"]): r for r in rows}
    assert by["vLLM ngram k=4", 0.0]["identical"] and by["vLLM ngram k=4", 0.0]["lossless"]
    assert by["vLLM ngram k=4", 0.0]["vs_engine_ar"] == pytest.approx(by["vLLM ngram k=4", 0.8]["vs_engine_ar"] * 4)
    sampled = by["vLLM ngram k=4", 0.8]
    assert sampled["identical"] is None and sampled["agreement"] is None and not sampled["lossless"]
    assert by["vLLM plain", 0.8]["lossless"]  # no speculation: vLLM's own sampler
    _, failed = vllm_rows.bench_rows([dict(peer="vllm", mode="draft:4", temperature=0.8, error="E: x")], workloads,
                                     engine, "0.5B")
    assert failed == {"vLLM draft 0.5B k=4 (T=0.8)": "E: x"}


def test_vllm_missing_environment_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_rows, "VENV", tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="make vllm-env"):
        vllm_rows.python()
    from bench import bench_real

    with pytest.raises(argparse.ArgumentTypeError, match="make vllm-env"):
        bench_real.peer_option("vllm")
    with pytest.raises(argparse.ArgumentTypeError, match="known: llama.cpp, transformers, vllm"):
        bench_real.peer_option("sglang")
    assert bench_real.peer_option("transformers") == "transformers"


def _fake_venv(tmp_path: Path) -> Path:
    """A folder whose bin/python is this interpreter: the runner subprocess without vLLM."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tmp_path / "venv" / "bin" / "python")
    return tmp_path / "venv"


@pytest.mark.parametrize("script, expect", [
    ("import sys; sys.exit(3)", "exited with status 3"),
    ("import time; time.sleep(30)", "timed out"),
])
def test_vllm_run_peer_turns_a_dead_runner_into_an_error(tmp_path, monkeypatch, script, expect):
    runner = tmp_path / "runner.py"
    runner.write_text(script)
    monkeypatch.setattr(vllm_rows, "RUNNER", runner)
    result = vllm_rows.run_peer(dict(mode="plain"), venv=_fake_venv(tmp_path), timeout=2)
    assert expect in result["error"] and result["mode"] == "plain"


def test_vllm_run_peer_reads_the_runner_result(tmp_path, monkeypatch):
    runner = tmp_path / "runner.py"
    runner.write_text("import json, sys\njob = json.load(open(sys.argv[1]))\n"
                      "out = dict(peer='vllm', mode=job['mode'], prompts=[dict(new_tokens=p[::-1], seconds=0.5)"
                      " for p in job['prompts']])\nopen(sys.argv[3], 'w').write(json.dumps(out))\n")
    monkeypatch.setattr(vllm_rows, "RUNNER", runner)
    result = vllm_rows.run_peer(dict(mode="ngram:4", prompts=[[1, 2, 3]]), venv=_fake_venv(tmp_path), timeout=60)
    assert result["prompts"] == [dict(new_tokens=[3, 2, 1], seconds=0.5)]


def test_vllm_runner_modes():
    sys.path.insert(0, str(Path(vllm_rows.RUNNER).parent))
    import vllm_peer  # the runner imports vllm only inside run(): its helpers load anywhere

    assert vllm_peer.parse_mode("plain") == ("plain", None) and vllm_peer.parse_mode("draft:4") == ("draft", 4)
    for bad in ("plain:1", "ngram", "ngram:0", "eagle:3"):
        with pytest.raises(ValueError):
            vllm_peer.parse_mode(bad)
    assert vllm_peer.speculative_config(dict(mode="plain")) is None
    assert vllm_peer.speculative_config(dict(mode="ngram:4", prompt_lookup_max=3)) == dict(
        method="ngram", num_speculative_tokens=4, prompt_lookup_max=3, prompt_lookup_min=1)
    assert vllm_peer.speculative_config(dict(mode="draft:2", draft_model="/d")) == dict(
        method="draft_model", model="/d", num_speculative_tokens=2)
    with pytest.raises(ValueError, match="draft_model"):
        vllm_peer.speculative_config(dict(mode="draft:2"))


def test_transformers_rows_on_a_tiny_pair(tmp_path):
    from test_e2e import save_random_pair

    pair = save_random_pair(tmp_path / "pair")
    workloads = {"bench": [[5, 6, 7, 8, 5, 6]], "heldout": [[9, 10, 11]]}
    rows = transformers_rows.measure(pair / "target", pair / "draft", workloads, 4, None, {}, dtype="float32",
                                     threads=1)
    names = ["transformers plain", "transformers assistant_model draft", "transformers prompt_lookup n=10",
             "transformers prompt_lookup n=32"]
    assert [(r["workload"], r["method"]) for r in rows] == [(w, n) for w in workloads for n in names]
    assert all(r["tokens"] == 4 and r["tokens_per_s"] > 0 and r["dtype"] == "float32" for r in rows)
    assert all(r["identical"] for r in rows)  # float32 greedy: transformers' speculation keeps its tokens
    assert all(r["vs_engine_ar"] is None and r["agreement"] is None for r in rows)
    # Sampled: one row per configuration and temperature, against the engine's row at that temperature.
    engine = {(w, t): dict(tokens_per_s=2.0, outputs=[[1]]) for w in workloads for t in (0.0, 0.8)}
    rows = transformers_rows.measure(pair / "target", pair / "draft", {"heldout": workloads["heldout"]}, 4, None,
                                     engine, dtype="float32", threads=1, temperatures=(0.0, 0.8), seed=3)
    assert [(r["method"], r["temperature"]) for r in rows] == [(n, t) for t in (0.0, 0.8) for n in names]
    sampled = [r for r in rows if r["temperature"] == 0.8]
    assert all(r["identical"] is None and r["agreement"] is None and r["tokens"] == 4 for r in sampled)
    assert all(r["vs_engine_ar"] == pytest.approx(r["tokens_per_s"] / 2.0) for r in rows)


def test_llama_cpp_run_peer_retries_a_crash_without_extra_buffers(tmp_path, monkeypatch):
    from bench.peers import llama_cpp_rows

    runner = tmp_path / "runner.py"  # dies of SIGSEGV unless told to load without extra buffer types
    runner.write_text("import json, os, signal, sys\njob = json.load(open(sys.argv[1]))\n"
                      "if job.get('extra_buffers', True):\n    os.kill(os.getpid(), signal.SIGSEGV)\n"
                      "open(sys.argv[3], 'w').write(json.dumps(dict(peer='llama.cpp', "
                      "extra_buffers=job['extra_buffers'], modes={})))\n")
    monkeypatch.setattr(llama_cpp_rows, "RUNNER", runner)
    result = llama_cpp_rows.run_peer(dict(modes=["plain"]), venv=_fake_venv(tmp_path), timeout=60)
    assert result["extra_buffers"] is False and "signal 11" in result["retried"]
    runner.write_text("import sys\nsys.exit(3)\n")  # an ordinary failure is not retried
    with pytest.raises(RuntimeError, match="exit 3"):
        llama_cpp_rows.run_peer(dict(modes=["plain"]), venv=tmp_path / "venv", timeout=60)


def test_llama_cpp_jobs_and_sampled_rows():
    from bench.peers import llama_cpp_rows

    job = llama_cpp_rows.job(Path("t.gguf"), None, [[1], [2]], 4, [9], 2, temperature=0.8, seed=5)
    assert job["temperature"] == 0.8 and job["seed"] == 5 and not any(m.startswith("draft:") for m in job["modes"])
    workloads = {"heldout": [[1], [2]]}

    def result(t):
        mode = lambda outs: dict(prompts=[dict(new_tokens=o, seconds=1.0, prefill_seconds=0.1, target_forwards=1,
                                               drafted=2) for o in outs])
        return dict(peer="llama.cpp", temperature=t, modes={"plain": mode([[5], [6, 7]]),
                                                             "prompt_lookup:10": mode([[5], [6, 8]])})

    greedy = llama_cpp_rows.bench_rows(result(0.0), workloads, {"heldout": dict(tokens_per_s=1.5,
                                                                               outputs=[[5], [6, 7]])})
    by = {r["method"]: r for r in greedy}
    assert by["llama.cpp plain"]["identical"] and by["llama.cpp plain"]["agreement"]["positions"] == 1.0
    assert by["llama.cpp prompt_lookup n=10"]["identical"] is False and by["llama.cpp plain"]["lossless"]
    sampled = llama_cpp_rows.bench_rows(result(0.8), workloads, {"heldout": dict(tokens_per_s=3.0, outputs=[[1], [2]])})
    assert all(r["temperature"] == 0.8 and r["identical"] is None and r["agreement"] is None
               and r["lossless"] is None for r in sampled)
    assert sampled[0]["vs_engine_ar"] == pytest.approx(greedy[0]["vs_engine_ar"] / 2)
    llama_cpp_rows.print_rows(sampled)
