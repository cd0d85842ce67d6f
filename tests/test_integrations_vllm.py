"""The vLLM plugin (specdec_cuda.integrations.vllm).

Without vLLM (the project's .venv): the proposer against the n-gram reference, its bookkeeping of
rows that move, start or finish, the sampler's mapping of vLLM's flattened layout onto
``verify_chain``, and which steps it leaves to vLLM's own sampler (with stand-ins for vLLM's
metadata objects).

With vLLM (``.venv-vllm``, ``make vllm-env``, the project built and registered there; these tests
skip where ``vllm`` cannot be imported): a tiny random Qwen2 folder with a word-level tokenizer,
written by the test, one engine per process (tests/_vllm_engine.py), float32, greedy rows compared
token for token with plain vLLM decoding without the plugin:

* the plugin's prompt-lookup proposer (``custom_class``) with the engine core in its own process:
  the plugin is live in the worker (its sampler verified every step there), greedy output is
  plain decoding's, and so are the greedy rows of a batch that also holds T = 0.8 rows;
* vLLM's own ``ngram`` proposer verified by the plugin's sampler: the same two checks, and a
  request asking for logprobs goes to vLLM's own sampler (and still decodes greedily);
* the sampled distribution of the first tokens (prompt lookup, T = 2) fits the exact one as well
  as plain vLLM's samples do (chi-square);
* a loopback OpenAI server (127.0.0.1, bounded requests) with the plugin and its proposer.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PROPOSER = "specdec_cuda.integrations.vllm.PromptLookupProposer"


# --- without vLLM -----------------------------------------------------------------------------

def _config(k: int = 3, max_model_len: int = 64):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                           model_config=SimpleNamespace(max_model_len=max_model_len))


def _expected(context: list[int], k: int, room: int) -> list[int]:
    from specdec_cuda.ngram import NgramIndex, lookup

    index = NgramIndex(1, 4)
    index.extend(context)
    found = lookup([index], k, 1, max_depth=min(k, room))
    return found.tokens[0, : int(found.num_nodes[0])].tolist()


def test_prompt_lookup_proposer_drafts_from_each_rows_committed_tokens():
    from specdec_cuda.integrations.vllm import PromptLookupProposer

    k, max_len = 3, 64
    proposer = PromptLookupProposer(_config(k, max_len))
    proposer.load_model(object())
    rng = np.random.default_rng(0)
    texts = {name: [int(t) for t in rng.integers(0, 6, 12)] for name in "abcdef"}
    token_ids = np.zeros((8, max_len), dtype=np.int32)
    # Per step: the request in each row (None = empty row), and whether it sampled this step.
    steps = [["a", "b", "c"], ["a", "b", "c"], ["c", "b"], ["d", "b", "a"], ["d", "e", "a", "b"],
             ["d", "e", "a", "b"], ["f"]]
    for step, rows in enumerate(steps):
        sampled = []
        for row, name in enumerate(rows):
            texts[name].append(int(rng.integers(0, 6)))
            token_ids[row, : len(texts[name])] = texts[name]
            sampled.append([texts[name][-1]] if step != 1 or row != 1 else [])  # row 1 idles once
        num_tokens = np.array([len(texts[n]) for n in rows] + [0] * (8 - len(rows)), dtype=np.int32)
        drafts = proposer.propose(sampled, num_tokens, token_ids)
        assert len(drafts) == len(rows)
        for row, name in enumerate(rows):
            want = _expected(texts[name], k, max_len - len(texts[name])) if sampled[row] else []
            assert drafts[row] == want, (step, row)
    # at max_model_len: no draft; an empty batch: no rows
    full = np.array([max_len], dtype=np.int32)
    assert proposer.propose([[1]], full, np.ones((1, max_len), dtype=np.int32)) == [[]]
    assert proposer.propose([], np.zeros(0, dtype=np.int32), np.zeros((0, max_len), dtype=np.int32)) == []


def test_the_same_text_in_two_rows_gets_two_indexes():
    from specdec_cuda.integrations.vllm import PromptLookupProposer

    proposer = PromptLookupProposer(_config(2))
    text = [1, 2, 3, 1, 2, 3, 1]
    token_ids = np.zeros((2, 64), dtype=np.int32)
    token_ids[:, :7] = text
    assert proposer.propose([[1], [1]], np.array([7, 7]), token_ids) == [[2, 3], [2, 3]]
    token_ids[0, 7], token_ids[1, 7] = 2, 5  # the rows part ways
    assert proposer.propose([[2], [5]], np.array([8, 8]), token_ids) == [[3, 1], []]


def _metadata(drafts: list[list[int]]):
    num = [len(d) for d in drafts]
    return SimpleNamespace(draft_token_ids=torch.tensor(sum(drafts, []), dtype=torch.int32),
                           num_draft_tokens=num, max_spec_len=max(num),
                           cu_num_draft_tokens=torch.tensor(np.cumsum(num), dtype=torch.int32))


def _sampling(temperature=None, top_k=None, top_p=None, generators=None):
    t = temperature
    return SimpleNamespace(all_greedy=t is None or bool((t == 0).all()), all_random=t is not None and bool((t > 0).all()),
                           temperature=t, top_k=top_k, top_p=top_p, generators=generators or {})


def test_verify_batch_reads_vllms_layout_greedy():
    from specdec_cuda import ops
    from specdec_cuda.integrations.vllm import verify_batch

    vocab = 11
    drafts = [[3, 4, 5], [], [7, 7]]
    num_rows = sum(map(len, drafts)) + len(drafts)
    # rows 0-3: request 0 (3 drafts + bonus), row 4: request 1 (bonus only), rows 5-7: request 2
    argmax = [3, 4, 9, 1, 6, 7, 2, 5]
    logits = torch.full((num_rows, vocab), -1.0)
    logits[torch.arange(num_rows), torch.tensor(argmax)] = 4.0
    tokens = verify_batch(ops, _metadata(drafts), logits, _sampling())
    assert tokens.dtype == torch.int32
    assert tokens.tolist() == [[3, 4, 9, -1], [6, -1, -1, -1], [7, 2, -1, -1]]


def test_verify_batch_mixes_greedy_and_sampled_rows():
    from specdec_cuda import ops
    from specdec_cuda.integrations.vllm import verify_batch

    torch.manual_seed(0)
    vocab, drafts = 13, [[1, 2], [3, 4], [5]]
    logits = torch.randn(sum(map(len, drafts)) + 3, vocab)
    temperature = torch.tensor([0.0, 0.8, 0.0])
    top_k = torch.tensor([vocab, 4, vocab], dtype=torch.int32)  # vLLM's "off" is the vocabulary size
    top_p = torch.tensor([1.0, 0.9, 1.0])
    greedy = verify_batch(ops, _metadata(drafts), logits, _sampling())

    def mixed(global_seed: int) -> torch.Tensor:
        torch.manual_seed(global_seed)
        gen = torch.Generator().manual_seed(5)  # the request's SamplingParams(seed=...)
        return verify_batch(ops, _metadata(drafts), logits, _sampling(temperature, top_k, top_p, {1: gen}))

    first, second = mixed(1), mixed(2)
    assert first[[0, 2]].tolist() == greedy[[0, 2]].tolist()
    assert first.tolist() == second.tolist()  # the seeded row depends on its generator alone
    row = first[1]
    emitted = row[row >= 0]
    assert 1 <= len(emitted) <= 3
    # top-k 4 at T = 0.8: each emitted token is among its position's 4 best (request 1's logits
    # start at row 3: request 0's 2 drafts and bonus come first)
    for j, token in enumerate(emitted.tolist()):
        assert token in logits[3 + j].topk(4).indices.tolist()


def test_steps_that_need_more_than_temperature_top_k_top_p_are_delegated():
    from specdec_cuda.integrations.vllm import plain_sampling

    MinPLogitsProcessor = type("MinPLogitsProcessor", (), {"min_p_count": 0})
    LogitBiasLogitsProcessor = type("LogitBiasLogitsProcessor", (), {"biases": {}})
    Custom = type("MyProcessor", (), {})

    def metadata(processors=(), **changes):
        base = dict(max_num_logprobs=None, no_penalties=True, allowed_token_ids_mask=None, bad_words_token_ids={},
                    logprob_token_ids=None, thinking_budget_state_holder=None,
                    logitsprocs=SimpleNamespace(all=list(processors)))
        return SimpleNamespace(**{**base, **changes})

    assert plain_sampling(metadata([MinPLogitsProcessor(), LogitBiasLogitsProcessor()]))
    active = MinPLogitsProcessor()
    active.min_p_count = 1
    for m in (metadata(max_num_logprobs=0), metadata(no_penalties=False), metadata(bad_words_token_ids={0: [[5]]}),
              metadata(allowed_token_ids_mask=torch.zeros(1, 4, dtype=torch.bool)), metadata([active]),
              metadata([Custom()]),
              metadata(thinking_budget_state_holder=SimpleNamespace(has_tracked_requests=lambda: True))):
        assert not plain_sampling(m)


# --- with vLLM --------------------------------------------------------------------------------

VOCAB = 256
NEW_TOKENS = 24
_rng = np.random.default_rng(1)
PROMPTS = [[10, 11, 12, 13, 14, 15] * 3 + [10, 11],
           list(range(30, 60)) + list(range(30, 40)),
           [int(t) for t in _rng.integers(3, VOCAB, 24)]]


def greedy(prompt):
    return dict(prompt=prompt, max_tokens=NEW_TOKENS, temperature=0.0, seed=None)


def sampled(prompt, seed):
    return dict(prompt=prompt, max_tokens=NEW_TOKENS, temperature=0.8, seed=seed)


# greedy rows 0, 2, 4 are PROMPTS 0, 2, 1
MIXED = [greedy(PROMPTS[0]), sampled(PROMPTS[1], 7), greedy(PROMPTS[2]), sampled(PROMPTS[0], 8),
         greedy(PROMPTS[1])]
MIXED_GREEDY = {0: 0, 2: 2, 4: 1}

# The sampled distribution: DIST_SAMPLES seeded requests for DIST_TOKENS tokens after a prompt
# whose greedy text is a run of 211 (the n-gram drafts are 211s), at a temperature where the
# fixture's wide head spreads the next token over a few ids (211 about half the time), so drafts
# are accepted and rejected alike. Their joint is compared with the exact one (chi-square).
DIST_PROMPT = PROMPTS[2] + [211] * 4
DIST_TEMPERATURE = 2.0  # vLLM's largest
DIST_TOKENS = 3
DIST_SAMPLES = 800
DIST = [dict(prompt=DIST_PROMPT, max_tokens=DIST_TOKENS, temperature=DIST_TEMPERATURE, seed=1000 + i)
        for i in range(DIST_SAMPLES)]


@pytest.fixture(scope="module")
def vllm_env():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not importable here (it lives in .venv-vllm: make vllm-env)")
    from importlib.metadata import entry_points

    names = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert names.get("specdec_cuda") == "specdec_cuda.integrations.vllm:register", (
        "the plugin is not registered in this environment: run "
        "`SPECDEC_REGISTER_ONLY=1 pip install --no-build-isolation --no-deps -e .` with its pip")
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="nobind",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(ROOT / "python"), os.environ.get("PYTHONPATH", "")]))
    env.pop("VLLM_PLUGINS", None)
    return env


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory, vllm_env) -> Path:
    """A random 2-layer Qwen2 (vocab 256, float32) and a word-level tokenizer: w<i> is id i."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = tmp_path_factory.mktemp("tiny-qwen2")
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials + [f"w{i}" for i in range(len(specials), VOCAB)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>")
    fast.save_pretrained(folder)
    config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, torch_dtype="float32",
                                      initializer_range=0.2)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        # Attention turned down: the next token is mostly a function of the last one, so greedy
        # text falls into cycles that n-gram drafts hit (two of PROMPTS within NEW_TOKENS). A wide
        # head: argmax margins (>= 0.09 here) far above float32 rounding of batched forwards.
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(0.001)
        model.lm_head.weight.mul_(20.0)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def exact_dist(tiny_model) -> dict:
    """P(x1 .. x_DIST_TOKENS | DIST_PROMPT) at DIST_TEMPERATURE, by transformers on the same folder
    (float32), over every sequence of probability above 1e-7 (the rest is below the test's reach)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    dist = {(): 1.0}
    for _ in range(DIST_TOKENS):
        prefixes = list(dist)
        with torch.no_grad():
            logits = model(torch.tensor([DIST_PROMPT + list(p) for p in prefixes])).logits[:, -1].double()
        probs = (logits / DIST_TEMPERATURE).softmax(-1)
        dist = {p + (t,): dist[p] * float(probs[i, t]) for i, p in enumerate(prefixes)
                for t in range(VOCAB) if dist[p] * float(probs[i, t]) > 1e-7}
    return dist


def chi2_pvalue(samples: list[list[int]], dist: dict) -> float:
    """Goodness of fit of the sampled sequences to ``dist``: cells of expected count >= 5, the rest
    pooled into one cell."""
    n = len(samples)
    counts: dict[tuple, int] = {}
    for s in samples:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    cells = sorted((seq for seq, p in dist.items() if p * n >= 5), key=dist.get, reverse=True)
    observed = [counts.get(seq, 0) for seq in cells]
    expected = [dist[seq] * n for seq in cells]
    rest_observed, rest_expected = n - sum(observed), n - sum(expected)
    if rest_expected >= 5:
        observed.append(rest_observed)
        expected.append(rest_expected)
    else:  # too small a cell of its own: merged into the least likely one (a coarser partition)
        observed[-1] += rest_observed
        expected[-1] += rest_expected
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def run_engines(env: dict, jobs: dict[str, tuple[dict, bool]], tmp_path: Path) -> dict[str, dict]:
    """Each job (name -> (job, plugin)) in an engine process of its own, all at once: the engines
    are single-threaded, and each spends ~10 s importing vLLM, so on CI's 2 cores running them side
    by side takes ~40% less wall time than one after another. Returns name -> result."""
    started = {}
    for name, (job, plugin) in jobs.items():
        job_path, out_path = tmp_path / f"{name}.json", tmp_path / f"{name}.out.json"
        job_path.write_text(json.dumps(job))
        log = open(tmp_path / f"{name}.log", "w+")
        run_env = dict(env) if plugin else dict(env, VLLM_PLUGINS="")  # "": vLLM loads no plugin at all
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "_vllm_engine.py"), str(job_path),
                                 str(out_path)], env=run_env, stdout=log, stderr=subprocess.STDOUT)
        started[name] = (proc, log, out_path)
    results = {}
    try:
        for name, (proc, log, out_path) in started.items():
            code = proc.wait(timeout=600)
            log.seek(0)
            assert code == 0, f"{name}: engine failed\n{log.read()[-6000:]}"
            results[name] = json.loads(out_path.read_text())
    finally:
        for proc, log, _ in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    return results


@pytest.fixture(scope="module")
def engine_runs(vllm_env, tiny_model, tmp_path_factory) -> dict[str, dict]:
    """The module's three engine runs, side by side (``run_engines``):

    * ``plain``: vLLM without the plugin and without speculation: greedy decoding of PROMPTS, then
      the DIST samples;
    * ``prompt_lookup``: the plugin's sampler and PromptLookupProposer, the engine core in a
      process of its own: PROMPTS greedy, the MIXED batch, the DIST samples;
    * ``ngram``: vLLM's own n-gram drafter verified by the plugin: PROMPTS greedy, MIXED, and a
      request for logprobs (which the kernel does not compute: those steps are vLLM's own)."""
    model = str(tiny_model)
    jobs = {
        "plain": (dict(model=model, speculative_config=None, batches=[[greedy(p) for p in PROMPTS], DIST]), False),
        "prompt_lookup": (dict(model=model, multiprocessing=True,
                               speculative_config=dict(method="custom_class", model=PROPOSER, num_speculative_tokens=3),
                               batches=[[greedy(p) for p in PROMPTS], MIXED, DIST]), True),
        "ngram": (dict(model=model, speculative_config=dict(method="ngram", num_speculative_tokens=3,
                                                            prompt_lookup_max=3, prompt_lookup_min=1),
                       batches=[[greedy(p) for p in PROMPTS], MIXED, [dict(greedy(PROMPTS[1]), logprobs=2)]]), True),
    }
    return run_engines(vllm_env, jobs, tmp_path_factory.mktemp("engines"))


@pytest.fixture(scope="module")
def plain_run(engine_runs) -> dict:
    out = engine_runs["plain"]
    assert out["workers"][0]["sampler"] is None  # no speculation: no rejection sampler
    return out


@pytest.fixture(scope="module")
def plain(plain_run) -> list[list[int]]:
    rows = plain_run["outputs"][0]
    assert all(len(r) == NEW_TOKENS for r in rows)
    return rows


@pytest.fixture(scope="module")
def prompt_lookup_run(engine_runs) -> dict:
    return engine_runs["prompt_lookup"]


def check_speculative(out: dict, plain: list[list[int]], drafter_suffix: str, delegated: bool = False) -> None:
    alone, mixed = out["outputs"][:2]
    assert alone == plain, "greedy output differs from plain decoding"
    for row, prompt in MIXED_GREEDY.items():
        assert mixed[row] == plain[prompt], f"greedy row {row} beside T = 0.8 rows differs from plain decoding"
    for row in set(range(len(MIXED))) - set(MIXED_GREEDY):
        assert len(mixed[row]) == NEW_TOKENS and all(0 <= t < VOCAB for t in mixed[row])
    (worker,) = out["workers"]
    assert worker["sampler"] == "VerifyChainSampler", worker
    assert worker["drafter"].endswith(drafter_suffix), worker
    assert worker["steps_verified"] > 0 and (worker["steps_delegated"] > 0) == delegated, worker
    assert out["drafts"] > 0 and out["draft_tokens"] >= out["accepted"] > 0, out


@pytest.mark.slow
def test_prompt_lookup_proposer_in_vllm_is_plain_greedy_decoding(prompt_lookup_run, plain):
    out = prompt_lookup_run
    check_speculative(out, plain, "PromptLookupProposer")
    assert out["workers"][0]["pid"] != out["pid"], "the engine core was meant to run in its own process"


@pytest.mark.slow
def test_sampled_distribution_is_at_the_plain_noise_floor(prompt_lookup_run, plain_run, exact_dist):
    """The plugin's samples (prompt lookup drafting, verify_chain verifying) fit the exact joint of
    the first DIST_TOKENS tokens as well as plain vLLM's do."""
    speculative, plain_samples = prompt_lookup_run["outputs"][2], plain_run["outputs"][1]
    first = {seq[0]: 0.0 for seq in exact_dist}
    for seq, p in exact_dist.items():
        first[seq[0]] += p
    assert 0.2 < first.get(211, 0.0) < 0.9, "the drafts (211) should be accepted and rejected alike"
    assert all(len(s) == DIST_TOKENS for s in speculative + plain_samples)
    p_plain, p_spec = chi2_pvalue(plain_samples, exact_dist), chi2_pvalue(speculative, exact_dist)
    assert p_plain > 1e-3, f"plain vLLM does not fit the exact distribution (p = {p_plain:.2e}): check the fixture"
    assert p_spec > 1e-3, f"speculative samples do not fit the exact distribution: p = {p_spec:.2e} (plain: {p_plain:.2e})"


@pytest.mark.slow
def test_vllm_ngram_verified_by_the_plugin_is_plain_greedy_decoding(engine_runs, plain):
    out = engine_runs["ngram"]
    check_speculative(out, plain, "NgramProposer", delegated=True)
    assert out["outputs"][2] == [plain[1]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 120) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_openai_server_with_the_plugin(vllm_env, tiny_model, plain, tmp_path):
    port = _free_port()
    spec = json.dumps(dict(method="custom_class", model=PROPOSER, num_speculative_tokens=3))
    log_path = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model),
           "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--enforce-eager", "--max-model-len", "256", "--max-num-seqs", "4", "--no-enable-prefix-caching",
           "--distributed-executor-backend", "uni", "--speculative-config", spec]
    with open(log_path, "w") as log:
        server = subprocess.Popen(cmd, env=vllm_env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, f"the server exited\n{log_path.read_text()[-6000:]}"
            assert time.monotonic() < deadline, f"the server did not come up\n{log_path.read_text()[-6000:]}"
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        body = dict(model="tiny", prompt=PROMPTS[0], max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
        reply = _post(f"{base}/v1/completions", body)
        # the word-level tokenizer has no decoder: the text is the words run together, "w<id>w<id>..."
        words = reply["choices"][0]["text"].split("w")[1:]
        assert words == [str(t) for t in plain[0]], reply
        reply = _post(f"{base}/v1/completions", dict(body, temperature=0.8, seed=3))
        assert len(reply["choices"][0]["text"].split("w")[1:]) == NEW_TOKENS, reply
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    log = log_path.read_text()
    assert "specdec_cuda: verify_chain is vLLM's rejection sampler" in log, log[-6000:]
