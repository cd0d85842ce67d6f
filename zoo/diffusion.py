"""The zoo's masked-diffusion LM: trained here, offline, on the zoo corpus with the zoo's tokenizer.

A bidirectional Llama-style model (``models.diffusion_lm``) learns LLaDA's objective: each
training sequence is masked at a ratio ``t ~ U(0, 1)`` (every token independently with probability
``t``), and the loss is the cross entropy on the masked positions weighted by ``1 / t``, an upper
bound on the negative log-likelihood. Half of each batch keeps a random-length prefix unmasked, the
shape of generation (a clean prompt, a masked continuation).

Two ways to start (``DiffusionSpec.init``):

* ``"target"`` (the default spec): adapt the zoo's autoregressive target, as Dream 7B was
  initialised from Qwen2.5. Every weight is the target's (``diffusion_lm.from_causal_lm``), the mask
  token is appended, and the AR shift is kept (``shifted_logits``: the hidden state at i predicts
  the token at i + 1), so the model starts from what the target knows and only has to learn to use
  bidirectional attention and masked inputs; a lower learning rate than from scratch. Position 0
  is never masked (it has no left neighbour to predict it from). The target folder is an argument
  (``--target DIR``; default the pair's cached target) so it re-runs against a newer target; the
  result is saved beside that target's pair folder as ``<pair>-diffusion-ar``.
* ``"scratch"`` (``--zoo scratch``): a small model from random weights (the first zoo diffusion
  LM; weaker: its confidences stay below Fast-dLLM's thresholds).

The corpus and tokenizer are the zoo pair's (``pairs.stdlib_corpus``, ``pairs.train_tokenizer`` with
the pair's vocabulary size), so the diffusion model's text can be scored by the zoo's autoregressive
target. The tokenizer is read from the cached pair when it exists, otherwise trained the same way;
the mask token is one extra id after it. The checkpoint folder is saved beside the pair,
``pairs.zoo_root() / spec.name``, and trained on first use (``get_diffusion``) with a progress line
and an ETA. ``python -m zoo.diffusion [--spec small]`` trains it ahead of time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from . import pairs
from specdec_cuda.models.diffusion_lm import MASK_TOKEN, DiffusionConfig, DiffusionLM, from_causal_lm, load_diffusion


@dataclass
class DiffusionSpec:
    """Everything that determines the trained diffusion model; ``name`` is its cache folder.

    ``SCRATCH_SPEC`` is sized for about 10 minutes on 2 otherwise idle CPU cores: 6 layers of 256
    (~6M parameters with the embeddings), 16 x 256 tokens per step, so a step costs about what one
    of the zoo target's steps costs (~1.3 s there), and 420 steps see ~1.7M tokens. Masked
    diffusion learns more slowly per token than next-token prediction, so that model is weaker
    than the zoo target; it is a working example of the method, not a competitive LM.

    With ``init="target"`` the architecture fields are ignored (the target's are used).
    """

    name: str = "pystdlib-v3-diffusion"
    pair: str = "default"  # which zoo pair's tokenizer (pairs.SPECS key)
    seq_len: int = 256
    batch_size: int = 16
    num_layers: int = 6
    hidden_size: int = 256
    intermediate_size: int = 704
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position: int = 1024
    steps: int = 420
    lr: float = 2e-3
    prefix_fraction: float = 0.5  # share of rows that keep a clean prefix
    min_mask_ratio: float = 1e-3  # t ~ U(min, 1): keeps the 1/t weight bounded
    eval_tokens: int = 16384
    seed: int = 0
    corpus_chars: int = 0  # 0: the whole corpus; else its first characters (tiny test specs)
    vocab_size: int = 0  # 0: the pair's; else train a tokenizer of this size (tiny test specs)
    init: str = "scratch"  # "scratch": random weights; "target": adapted from the AR target
    target_dir: str = ""  # init "target": the AR checkpoint folder ("": the pair's cached target)
    bf16: bool = False  # bf16 autocast for the matmuls on the CPU (AMX / AVX512-BF16); fp32 weights

    def __post_init__(self) -> None:
        if self.init not in ("scratch", "target"):
            raise ValueError(f"init must be 'scratch' or 'target', got {self.init!r}")


# From scratch (the first zoo diffusion LM; `--zoo scratch`).
SCRATCH_SPEC = DiffusionSpec()
# The default: the zoo target adapted (Dream's recipe). 500 steps of 16 x 256 in bf16 autocast:
# 0.77 s per step on 2 threads at load ~1.5 (1.21 s on one), so ~7 minutes with the evaluation;
# 769 s end to end on one thread of the busy shared machine (load ~3). Peak learning rate 1e-3,
# below the from-scratch 2e-3.
DEFAULT_SPEC = DiffusionSpec(name="pystdlib-v3-diffusion-ar", init="target", steps=500, lr=1e-3, bf16=True)
# For busy machines (`--zoo small`): the small pair's tokenizer, a quarter of the steps.
SMALL_SPEC = DiffusionSpec(name="pystdlib-v3-small-diffusion", pair="small", seq_len=128, steps=160, lr=3e-3)
# Zoo v4's: adapted from the v4 target; `--zoo v4 --ship` writes a bf16 copy beside the shipped pair.
V4_SPEC = DiffusionSpec(name="pycode-v4-diffusion-ar", pair="v4", init="target", steps=500, lr=1e-3, bf16=True)
SPECS = {"default": DEFAULT_SPEC, "scratch": SCRATCH_SPEC, "small": SMALL_SPEC, "v4": V4_SPEC}


def _log(line: str) -> None:
    print(line, flush=True)


def _tokenizer(spec: DiffusionSpec, texts: Sequence[str], root: Path, log):
    """The zoo pair's tokenizer (read from the cached pair, else trained the same way)."""
    pair = pairs.SPECS[spec.pair]
    if spec.vocab_size:
        return pairs.train_tokenizer(texts, spec.vocab_size)
    cached = root / pair.name / "target"
    if (cached / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        log(f"[zoo-diffusion] tokenizer of the cached pair {cached}")
        return AutoTokenizer.from_pretrained(str(cached))
    log(f"[zoo-diffusion] no cached pair at {cached.parent}; training its tokenizer (same corpus and size)")
    return pairs.train_tokenizer(texts, pair.vocab_size)


def masked_diffusion_loss(model: DiffusionLM, x0: torch.Tensor, gen: torch.Generator,
                          min_ratio: float = 1e-3, prefix_fraction: float = 0.0) -> torch.Tensor:
    """LLaDA's objective on a batch of clean sequences.

    Each row b draws ``t_b ~ U(min_ratio, 1)`` and masks every token with probability ``t_b``
    (rows chosen with probability ``prefix_fraction`` first keep a prefix of random length, up to
    half the row, unmasked); the loss is ``sum over masked (b, i) of CE(logits[b, i], x0[b, i]) /
    t_b``, divided by the number of maskable tokens. A model with ``shifted_logits`` never has
    position 0 masked (nothing left of it predicts it): its loss bounds the NLL of tokens 1..S-1
    given token 0.

    Shape: x0 [B, S] int64 -> scalar.
    """
    B, S = x0.shape
    first = 1 if getattr(model.config, "shifted_logits", False) else 0
    t = min_ratio + (1 - min_ratio) * torch.rand(B, 1, generator=gen)
    masked = torch.rand(B, S, generator=gen) < t
    with_prefix = torch.rand(B, 1, generator=gen) < prefix_fraction
    prefix = (torch.rand(B, 1, generator=gen) * (S // 2)).long()
    masked &= ~(with_prefix & (torch.arange(S)[None, :] < prefix))
    masked[:, :first] = False
    inputs = torch.where(masked, model.mask_token_id, x0)
    logits = model(inputs).logits
    ce = F.cross_entropy(logits[masked].float(), x0[masked], reduction="none")
    weights = (1.0 / t).expand(B, S)[masked]
    return (ce * weights).sum() / (B * (S - first))


@torch.no_grad()
def ar_eval_nll(folder: Path, data: torch.Tensor, seq_len: int) -> float:
    """The causal LM's next-token NLL per token on the same held-out windows (for comparison)."""
    from specdec_cuda.models import load

    ar = load(folder)
    n = (data.numel() // seq_len) * seq_len
    total, count = 0.0, 0
    for chunk in data[:n].view(-1, seq_len).split(8):
        B = chunk.shape[0]
        logits = ar.forward(chunk, torch.arange(seq_len).expand(B, seq_len), ar.new_cache(B, seq_len)).logits
        total += float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                       chunk[:, 1:].reshape(-1), reduction="sum"))
        count += B * (seq_len - 1)
    return total / count


def ar_target_dir(spec: DiffusionSpec, root: Path, log) -> Path:
    """The causal LM a ``init="target"`` spec adapts: ``spec.target_dir``, else the pair's target
    (cached under ``root``, trained first if absent)."""
    if spec.target_dir:
        folder = Path(spec.target_dir)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"target_dir {str(folder)!r} has no config.json (expected an AR checkpoint folder)")
        return folder
    return pairs.get_pair(pairs.SPECS[spec.pair], log=log, root=root)[0]  # shipped, else cached, else trained


@torch.no_grad()
def eval_loss(model: DiffusionLM, data: torch.Tensor, seq_len: int, seed: int = 1) -> float:
    """The objective on held-out windows (a fixed draw of masks): an upper bound on NLL per token."""
    gen = torch.Generator().manual_seed(seed)
    n = (data.numel() // seq_len) * seq_len
    chunks = data[:n].view(-1, seq_len).split(8)
    return float(sum(masked_diffusion_loss(model, c, gen) for c in chunks) / max(1, len(chunks)))


def train_diffusion(out_dir: Path, spec: DiffusionSpec = DEFAULT_SPEC, texts: Sequence[str] | None = None,
                    log: Callable[[str], None] | None = None, root: Path | None = None) -> dict:
    """Train the diffusion LM of ``spec``; save it (config, weights, tokenizer) to ``out_dir``.

    Returns the report (also ``out_dir/report.json``): sizes, losses, timings.
    """
    out_dir, log = Path(out_dir), log or _log
    root = Path(root or pairs.zoo_root())
    started = time.perf_counter()
    ar_dir = ar_target_dir(spec, root, log) if spec.init == "target" else None
    if texts is None:  # an adapted model never sees its target pair's held-out split
        texts = pairs.training_texts(ar_dir) if ar_dir is not None else pairs.stdlib_corpus()
    texts = list(texts)
    if spec.corpus_chars:
        joined, texts = "".join(texts)[: spec.corpus_chars], []
        texts = [joined[i: i + 4096] for i in range(0, len(joined), 4096)]
    if ar_dir is not None:
        from transformers import AutoTokenizer

        log(f"[zoo-diffusion] adapting the AR model {ar_dir} (its weights and tokenizer)")
        tokenizer = AutoTokenizer.from_pretrained(str(ar_dir))
    else:
        tokenizer = _tokenizer(spec, texts, root, log)
    eos_id = tokenizer.convert_tokens_to_ids(pairs.EOS)
    base_vocab = len(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": [MASK_TOKEN]})
    mask_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    if mask_id != base_vocab:
        raise RuntimeError(f"the mask token got id {mask_id}, expected {base_vocab} (one past the vocabulary)")
    data, train_data, eval_data = pairs.tokenize_split(tokenizer, texts, eos_id, spec.eval_tokens)
    if train_data.numel() <= spec.seq_len + 1:
        raise ValueError(f"corpus too small: {train_data.numel()} training tokens for windows of {spec.seq_len}")
    log(f"[zoo-diffusion] {len(texts)} texts, {data.numel()} tokens, vocab {base_vocab} + mask")

    torch.manual_seed(spec.seed)
    if ar_dir is not None:
        model = from_causal_lm(ar_dir, mask_token_id=mask_id, eos_token_id=eos_id)
        config = model.config
    else:
        config = DiffusionConfig(
            vocab_size=base_vocab + 1, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
            num_layers=spec.num_layers, num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
            mask_token_id=mask_id, eos_token_id=eos_id, max_position=spec.max_position)
        model = DiffusionLM(config)
    params = sum(p.numel() for p in model.parameters())
    log(f"[zoo-diffusion] training {params / 1e6:.1f}M params ({'from ' + str(ar_dir) if ar_dir else 'from scratch'}), "
        f"{spec.steps} steps of {spec.batch_size}x{spec.seq_len} tokens (LLaDA objective"
        f"{', bf16 autocast' if spec.bf16 else ''}), {torch.get_num_threads()} threads")
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.95), weight_decay=0.1)
    progress = pairs._Progress("diffusion", spec.steps, log, max(1, spec.steps // 20))
    gen = torch.Generator().manual_seed(spec.seed + 7)
    window_spec = dataclasses.replace(pairs.DEFAULT_SPEC, seq_len=spec.seq_len, batch_size=spec.batch_size)
    model.train()
    tokens = 0
    for step, (inputs, _labels) in enumerate(pairs._batches(train_data, window_spec, spec.steps, spec.seed), start=1):
        for group in opt.param_groups:
            group["lr"] = pairs._lr(step - 1, spec.steps, spec.lr)
        x0 = inputs  # [B, seq_len] windows of the corpus (the shifted labels are not needed)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec.bf16):
            loss = masked_diffusion_loss(model, x0, gen, spec.min_mask_ratio, spec.prefix_fraction)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens += x0.numel()
        progress(step, float(loss.detach()), tokens)
    model.eval()
    train_seconds = time.perf_counter() - started
    eval_len = min(spec.seq_len, eval_data.numel())
    held_out = eval_loss(model, eval_data, eval_len)
    report = {"spec": dataclasses.asdict(spec), "config": config.to_dict(), "params": params,
              "tokens": data.numel(), "eval_loss_bound": held_out, "train_seconds": train_seconds,
              "threads": torch.get_num_threads()}
    if ar_dir is not None:
        report["init_from"] = str(ar_dir)
        report["ar_eval_nll"] = ar_eval_nll(ar_dir, eval_data, eval_len)
    log(f"[zoo-diffusion] held-out LLaDA loss (NLL bound) {held_out:.3f}"
        + (f" (the AR model's next-token NLL on the same windows: {report['ar_eval_nll']:.3f})" if ar_dir else "")
        + f"; trained in {train_seconds:.0f}s")
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "report.json").write_text(json.dumps(report, indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)
    return report


def get_diffusion(spec: DiffusionSpec = DEFAULT_SPEC, log: Callable[[str], None] | None = None,
                  root: Path | None = None) -> Path:
    """The checkpoint folder of the zoo diffusion model: the copy shipped in the repository (when
    ``root`` is not given), else the cached one under ``root``, trained the first time."""
    if root is None and (found := trained_diffusion_dir(spec)) is not None:
        return found
    root = Path(root or pairs.zoo_root())
    out_dir = root / spec.name
    if not (out_dir / "report.json").exists():
        (log or _log)(f"[zoo-diffusion] no cached model at {out_dir}; training it once (~10 minutes on 2 idle cores)")
        train_diffusion(out_dir, spec, log=log, root=root)
    return out_dir


def trained_diffusion_dir(spec: DiffusionSpec) -> Path | None:
    """The folder of ``spec``'s trained model (shipped first, then the cache), or None."""
    for base in (pairs.shipped_root(), pairs.zoo_root()):
        if base is not None and (base / spec.name / "report.json").exists():
            return base / spec.name
    return None


def ship_diffusion(src: Path, dest: Path, dtype: torch.dtype = torch.bfloat16) -> dict:
    """Write the trained diffusion LM in ``src`` to ``dest`` as the copy committed to the
    repository: weights cast to ``dtype`` (``load_diffusion`` reads them back in any dtype), the
    tokenizer, and the report with a ``shipped`` entry. Written beside ``dest``, renamed into place."""
    from transformers import PreTrainedTokenizerFast

    src, dest = Path(src), Path(dest)
    model = load_diffusion(src).to(dtype)
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(tmp)
    PreTrainedTokenizerFast.from_pretrained(str(src)).save_pretrained(tmp)
    report = json.loads((src / "report.json").read_text())
    report["shipped"] = {"dtype": str(dtype).removeprefix("torch."), "bytes": pairs.folder_bytes(tmp),
                         "note": "figures above were measured on the fp32 weights before the cast"}
    (tmp / "report.json").write_text(json.dumps(report, indent=2))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return report["shipped"]


def load_zoo_diffusion(spec: DiffusionSpec = DEFAULT_SPEC, log=None, root: Path | None = None,
                       device="cpu") -> tuple[DiffusionLM, object]:
    """(model, tokenizer) of the zoo diffusion model, trained on first use."""
    from transformers import PreTrainedTokenizerFast  # not AutoTokenizer: config.json is not a transformers model's

    folder = get_diffusion(spec, log=log, root=root)
    return load_diffusion(folder, device=device), PreTrainedTokenizerFast.from_pretrained(str(folder))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.diffusion", description=__doc__.split("\n")[0])
    parser.add_argument("--zoo", choices=sorted(SPECS), default="default",
                        help="default: the AR target adapted; scratch: from random weights; small: the small pair's")
    parser.add_argument("--target", default=None,
                        help="the AR checkpoint folder to adapt (default spec only; default: the pair's "
                             "target); the result goes beside its pair folder as <pair>-diffusion-ar")
    parser.add_argument("--force", action="store_true", help="retrain even if cached")
    parser.add_argument("--ship", action="store_true",
                        help="then write a bf16 copy beside the shipped pairs (<repo>/zoo/<name>) for the repository")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    spec, root = SPECS[args.zoo], pairs.zoo_root()
    if args.target:
        if spec.init != "target":
            parser.error(f"--target adapts an AR model; the {args.zoo!r} spec trains from scratch")
        target = Path(args.target).resolve()
        spec = dataclasses.replace(spec, target_dir=str(target), name=f"{target.parent.name}-diffusion-ar")
        root = target.parent.parent
    if args.force:
        shutil.rmtree(root / spec.name, ignore_errors=True)
    folder = get_diffusion(spec, root=root)
    print(folder)
    if args.ship:
        if pairs.shipped_root() is None:
            parser.error("--ship writes into a source checkout's zoo/ folder; this install has none")
        dest = pairs.shipped_root() / spec.name
        shipped = ship_diffusion(folder, dest)
        print(f"shipped to {dest}: {shipped['dtype']}, {shipped['bytes'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
