"""Loaders for drafters other people trained and published, into this library's modules.

Three layouts, read as their reference repositories write them:

* **FasterDecoding Medusa** (``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt`` next to a
  ``config.json`` with ``medusa_num_heads`` / ``medusa_num_layers``; or a full model folder whose
  safetensors carry ``medusa_head.*`` tensors). The state dict is an ``nn.ModuleList`` of
  ``nn.Sequential``s, one per head: ``{i}.{j}.linear.{weight,bias}`` for the ResBlocks
  ``j < medusa_num_layers`` (``x + silu(W x + b)``; the repository repeats *one* block object, so
  every ``j`` holds the same tensors and a file may list only ``j = 0``), then, in the current
  layout, ``{i}.{L}.weight`` [V, H], the head's own LM head. The legacy layout (Medusa-2-era
  heads trained to reuse the base model's LM head) stops after the ResBlocks. The heads read the
  target's final normed hidden state and feed the LM head directly (no norm again)::

      logits_i = lm_head_i(ResBlock_i^L(final_norm(h)))      # lm_head_i = the target's in legacy

  -> ``MedusaHeads(num_layers=L, renorm=False, own_lm_heads=V or None)``.

* **z-lab DFlash** (an HF folder: ``config.json`` of a Qwen3 decoder with ``block_size``,
  ``num_target_layers`` and ``dflash_config = {target_layer_ids, mask_token_id}``;
  ``model.safetensors``). Weight names: ``fc.weight`` [H, k*H], ``hidden_norm.weight`` (the
  context norm), ``norm.weight``, ``layers.{i}.input_layernorm`` / ``post_attention_layernorm``,
  ``layers.{i}.self_attn.{q,k,v,o}_proj`` (+ biases with ``attention_bias``),
  ``layers.{i}.self_attn.{q,k}_norm``, ``layers.{i}.mlp.{gate,up,down}_proj``. The math is the
  library's DFlash drafter (KV injection of ``hidden_norm(fc(cat of target layers))``, q/k norms
  before RoPE, a bidirectional block, the target's LM head after ``norm``); the block's MASK is
  the target's embedding of ``mask_token_id``. Target layer ``l`` is the output of decoder layer
  ``l`` (the reference reads ``hidden_states[l + 1]`` of ``transformers``, whose entry 0 is the
  embedding), which is the library's numbering too.
  -> ``DFlashDrafter`` with ``DFlashConfig(mask_token_id=..., attention_bias=...)``.

* **EAGLE-3** (the EAGLE authors' ``yuhuili/EAGLE3-*`` and SpecForge's exports: a ``config.json``
  of a one-layer Llama with ``architectures: ["LlamaForCausalLMEagle3"]``, ``draft_vocab_size``,
  optionally ``target_hidden_size`` and ``eagle_config.eagle_aux_hidden_state_layer_ids``;
  ``model.safetensors`` (or shards) or ``pytorch_model.bin``). Weight names: ``fc.weight``
  [H, 3 H_t], ``midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}.weight``,
  ``midlayer.self_attn.{q,k,v}_proj.weight`` [.., 2H], ``midlayer.self_attn.o_proj.weight``,
  ``midlayer.mlp.{gate,up,down}_proj.weight``, ``norm.weight``, ``lm_head.weight`` [Vd, H], the
  buffers ``d2t`` [Vd] int64 and ``t2d`` [V] bool, and optionally ``embed_tokens.weight`` (used when
  present). Exports that name the layer ``layers.0.`` (vLLM's naming, e.g. converted checkpoints)
  or put everything under ``model.`` are read too. The aux layer ids are SGLang's numbering (id l =
  the output of decoder layer l), the library's; without them, EAGLE-3's default for the target.
  -> ``Eagle3Drafter`` (``models.eagle3``; its parameters carry these names).

Anything these modules cannot reproduce (sliding-window layers, scaled RoPE, a non-SiLU MLP,
ResBlocks with distinct weights per layer) is refused with an error naming the field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .dflash import DFlashConfig, DFlashDrafter
from .eagle3 import MODEL_TYPE as EAGLE3_MODEL_TYPE
from .eagle3 import Eagle3Config, Eagle3Drafter
from .heads import MedusaHeads, MTPModules
from .heads import load_heads as load_own_heads

MEDUSA_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
DFLASH_ARCHITECTURE = "DFlashDraftModel"
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


# -- Medusa (FasterDecoding) ------------------------------------------------------------------

def is_medusa_fasterdecoding(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a FasterDecoding Medusa checkpoint: a ``medusa_lm_head.*`` file, a folder
    holding one, or a folder whose ``config.json`` has ``medusa_num_heads``."""
    path = Path(path)
    if path.is_file():
        return path.name in MEDUSA_FILES
    if any((path / name).is_file() for name in MEDUSA_FILES):
        return True
    cfg = _read_json(path / "config.json")
    return isinstance(cfg, dict) and "medusa_num_heads" in cfg


def _read_json(path: Path):
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def _medusa_state(path: Path) -> tuple[dict[str, torch.Tensor], dict, Path]:
    """The heads' tensors (keys ``{i}.{j}...``), the config (may be empty) and the file read."""
    from safetensors.torch import load_file

    folder = path.parent if path.is_file() else path
    cfg = _read_json(folder / "config.json") or {}
    files = [path] if path.is_file() else [folder / n for n in MEDUSA_FILES if (folder / n).is_file()][:1]
    if files:
        file = files[0]
        if file.suffix == ".pt":
            state = torch.load(file, map_location="cpu", weights_only=True)
        else:
            state = load_file(str(file))
        # A state dict saved from the whole model rather than from model.medusa_head.
        if state and all(k.startswith("medusa_head.") for k in state):
            state = {k[len("medusa_head."):]: v for k, v in state.items()}
        return state, cfg, file
    # A full Medusa model folder: the heads live under ``medusa_head.`` among the base weights.
    state = {}
    for file in sorted(folder.glob("*.safetensors")):
        from safetensors import safe_open

        with safe_open(str(file), "pt") as f:
            for k in f.keys():
                if k.startswith("medusa_head."):
                    state[k[len("medusa_head."):]] = f.get_tensor(k)
    if not state:
        raise FileNotFoundError(f"{folder}: no Medusa heads found (expected {' or '.join(MEDUSA_FILES)}, or "
                                f"medusa_head.* tensors in its safetensors files)")
    return state, cfg, folder


def load_medusa_fasterdecoding(path: str | os.PathLike, dtype: torch.dtype = torch.float32,
                               device: torch.device | str = "cpu", num_layers: int | None = None) -> MedusaHeads:
    """Medusa heads from a FasterDecoding checkpoint (module docstring) as ``MedusaHeads``.

    ``path``: the folder (``config.json`` + ``medusa_lm_head.{safetensors,pt}``) or the heads file
    itself; ``num_layers``: ResBlocks per head when no ``config.json`` says (``medusa_num_layers``;
    default: the blocks the file lists). The heads are those the file holds (the repository's
    configs sometimes name more than were saved). Raises ValueError naming a field or tensor the
    library's heads cannot reproduce.
    """
    path = Path(path)
    state, cfg, source = _medusa_state(path)
    heads: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        head, _, rest = key.partition(".")
        if not head.isdigit() or not rest:
            raise ValueError(f"{source}: unexpected tensor {key!r} (FasterDecoding Medusa heads are named "
                             f"'<head>.<layer>.linear.weight' / '<head>.<layer>.weight')")
        heads.setdefault(int(head), {})[rest] = value
    K = len(heads)
    if sorted(heads) != list(range(K)):
        raise ValueError(f"{source}: Medusa heads {sorted(heads)} are not numbered 0 .. {K - 1}")

    block_layers = sorted({int(r.split(".")[0]) for h in heads.values() for r in h if r.endswith(".linear.weight")})
    if not block_layers:
        raise ValueError(f"{source}: no ResBlock tensors ('<head>.0.linear.weight'); medusa_num_layers = 0 "
                         f"heads are not supported")
    # A '<head>.<n>.weight' without '.linear' is the LM head after n ResBlocks.
    lm_at = sorted({int(r.split(".")[0]) for r in heads[0] if r.count(".") == 1 and r.endswith(".weight")})
    L = int(cfg.get("medusa_num_layers", num_layers or (lm_at[0] if lm_at else block_layers[-1] + 1)))
    if L < 1 or block_layers[-1] >= L:
        raise ValueError(f"{source}: medusa_num_layers = {L} but the file has ResBlock layer {block_layers[-1]}")
    weight0, bias0 = heads[0].get("0.linear.weight"), heads[0].get("0.linear.bias")
    if weight0 is None or weight0.dim() != 2 or weight0.shape[0] != weight0.shape[1]:
        raise ValueError(f"{source}: '0.0.linear.weight' must be a square [H, H] matrix, got "
                         f"{None if weight0 is None else tuple(weight0.shape)}")
    H = weight0.shape[0]
    has_lm = [f"{L}.weight" in h for h in heads.values()]
    if any(has_lm) and not all(has_lm):
        raise ValueError(f"{source}: some heads have their own LM head ('<head>.{L}.weight') and some do not")
    V = int(heads[0][f"{L}.weight"].shape[0]) if all(has_lm) else None

    weights, biases, lm_heads = [], [], []
    for i in range(K):
        h = heads[i]
        w, b = h.get("0.linear.weight"), h.get("0.linear.bias")
        if w is None or b is None:
            raise ValueError(f"{source}: head {i} lacks '{i}.0.linear.weight' or '{i}.0.linear.bias'")
        if tuple(w.shape) != (H, H) or tuple(b.shape) != (H,):
            raise ValueError(f"{source}: head {i}'s ResBlock is {tuple(w.shape)} / {tuple(b.shape)}, expected "
                             f"({H}, {H}) / ({H},)")
        for j in range(1, L):
            wj, bj = h.get(f"{j}.linear.weight"), h.get(f"{j}.linear.bias")
            # The repository repeats one ResBlock object, so its layers share weights; a checkpoint
            # with distinct ones per layer is another model.
            if wj is not None and not (torch.equal(wj, w) and bj is not None and torch.equal(bj, b)):
                raise ValueError(f"{source}: head {i}'s ResBlock layer {j} differs from layer 0; only the "
                                 f"shared block of FasterDecoding's medusa_num_layers is supported")
        known = {f"{j}.linear.{p}" for j in range(L) for p in ("weight", "bias")} | {f"{L}.weight"}
        unknown = sorted(set(h) - known)
        if unknown:
            raise ValueError(f"{source}: unexpected tensors of head {i}: {[f'{i}.{u}' for u in unknown[:4]]}")
        weights.append(w)
        biases.append(b)
        if V is not None:
            lm = h[f"{L}.weight"]
            if tuple(lm.shape) != (V, H):
                raise ValueError(f"{source}: head {i}'s LM head is {tuple(lm.shape)}, expected ({V}, {H})")
            lm_heads.append(lm)
    if "hidden_size" in cfg and int(cfg["hidden_size"]) != H:
        raise ValueError(f"{source}: config hidden_size {cfg['hidden_size']} differs from the heads' {H}")

    module = MedusaHeads(H, K, dtype, device, num_layers=L, renorm=False, own_lm_heads=V)
    with torch.no_grad():
        module.weight.copy_(torch.stack(weights).to(dtype))
        module.bias.copy_(torch.stack(biases).to(dtype))
        if V is not None:
            module.lm_heads.copy_(torch.stack(lm_heads).to(dtype))
    return module.requires_grad_(False).to(device)


# -- DFlash (z-lab) ---------------------------------------------------------------------------

def is_dflash_zlab(config: dict) -> bool:
    """Whether a parsed ``config.json`` is a z-lab DFlash drafter's."""
    return isinstance(config, dict) and ("dflash_config" in config
                                         or DFLASH_ARCHITECTURE in (config.get("architectures") or ()))


def zlab_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The reference's default target layers when ``dflash_config`` names none: the middle layer for
    one draft layer, else ``num_draft_layers`` evenly spaced from 1 to ``num_target_layers - 3``."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [int(round(start + i * (end - start) / (num_draft_layers - 1))) for i in range(num_draft_layers)]


def dflash_zlab_config(raw: dict, source: str = "config.json", mask_token_id: int | None = None) -> DFlashConfig:
    """The library's ``DFlashConfig`` for a z-lab drafter's ``config.json``; errors name the field."""
    def need(name):
        if name not in raw:
            raise ValueError(f"{source}: missing field {name!r} (z-lab DFlash drafters are Qwen3 configs)")
        return raw[name]

    if raw.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{source}: hidden_act {raw['hidden_act']!r} is not supported (SiLU-gated MLP only)")
    if raw.get("use_sliding_window") or "sliding_attention" in (raw.get("layer_types") or ()):
        raise ValueError(f"{source}: sliding-window layers (use_sliding_window / layer_types) are not supported")
    rope = raw.get("rope_scaling") or {}
    params = raw.get("rope_parameters") or {}  # transformers >= 5 keeps rope_theta here
    for name, spec in (("rope_scaling", rope), ("rope_parameters", params)):
        kind = spec.get("rope_type", spec.get("type", "default"))
        if kind != "default":
            raise ValueError(f"{source}: {name} of type {kind!r} is not supported (plain RoPE only)")
    if float(raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"{source}: partial_rotary_factor {raw['partial_rotary_factor']} is not supported")
    if raw.get("mlp_bias"):
        raise ValueError(f"{source}: mlp_bias is not supported")
    dflash = raw.get("dflash_config") or {}
    num_layers = int(need("num_hidden_layers"))
    layers = dflash.get("target_layer_ids")
    if layers is None:
        layers = zlab_target_layer_ids(int(need("num_target_layers")), num_layers)
    token = dflash.get("mask_token_id") if mask_token_id is None else mask_token_id
    if token is None:
        raise ValueError(f"{source}: dflash_config.mask_token_id is missing (pass mask_token_id=)")
    H, heads = int(need("hidden_size")), int(need("num_attention_heads"))
    return DFlashConfig(
        hidden_size=H, vocab_size=int(need("vocab_size")), target_layers=tuple(int(i) for i in layers),
        num_layers=num_layers, num_heads=heads, num_kv_heads=int(raw.get("num_key_value_heads", heads)),
        head_dim=int(raw.get("head_dim") or H // heads), intermediate_size=int(need("intermediate_size")),
        block_size=int(need("block_size")), rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(raw.get("rope_theta", params.get("rope_theta", 10000.0))),
        mask_token_id=int(token), attention_bias=bool(raw.get("attention_bias", False)),
        extra={"source": "z-lab/dflash"})


def _zlab_to_library(tensors: dict[str, torch.Tensor], config: DFlashConfig, source) -> dict[str, torch.Tensor]:
    """Rename (and fuse gate / up) a z-lab state dict into ``DFlashDrafter``'s names."""
    if tensors and all(k.startswith("model.") for k in tensors):
        tensors = {k[len("model."):]: v for k, v in tensors.items()}
    t = dict(tensors)
    out = {"fc.weight": t.pop("fc.weight", None), "context_norm": t.pop("hidden_norm.weight", None),
           "norm": t.pop("norm.weight", None)}
    proj = ("q_proj", "k_proj", "v_proj", "o_proj")
    for i in range(config.num_layers):
        p = q = f"layers.{i}."
        out[q + "input_norm"] = t.pop(p + "input_layernorm.weight", None)
        out[q + "post_norm"] = t.pop(p + "post_attention_layernorm.weight", None)
        for name in proj:
            out[q + name + ".weight"] = t.pop(p + f"self_attn.{name}.weight", None)
            if config.attention_bias:
                out[q + name + ".bias"] = t.pop(p + f"self_attn.{name}.bias", None)
        out[q + "q_norm"] = t.pop(p + "self_attn.q_norm.weight", None)
        out[q + "k_norm"] = t.pop(p + "self_attn.k_norm.weight", None)
        gate, up = t.pop(p + "mlp.gate_proj.weight", None), t.pop(p + "mlp.up_proj.weight", None)
        out[q + "gate_up.weight"] = None if gate is None or up is None else torch.cat([gate, up], dim=0)
        out[q + "down.weight"] = t.pop(p + "mlp.down_proj.weight", None)
    missing = [k for k, v in out.items() if v is None]
    if missing or t:
        raise ValueError(f"{source}: the z-lab DFlash weights do not match its config (missing "
                         f"{missing[:4]}, unexpected {sorted(t)[:4]})")
    return out


def load_dflash_zlab(folder: str | os.PathLike, mask_token_id: int | None = None) -> DFlashDrafter:
    """A z-lab DFlash drafter folder (module docstring) as a ``DFlashDrafter`` (fp32, CPU until
    ``attach``). ``mask_token_id`` overrides ``dflash_config.mask_token_id``. Raises ValueError
    naming a config field or tensor the library's drafter cannot reproduce."""
    from safetensors.torch import load_file

    folder = Path(folder)
    raw = _read_json(folder / "config.json")
    if not is_dflash_zlab(raw):
        raise ValueError(f"{folder}/config.json: not a z-lab DFlash config (no dflash_config, architectures "
                         f"without {DFLASH_ARCHITECTURE!r})")
    config = dflash_zlab_config(raw, f"{folder}/config.json", mask_token_id)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.safetensors weights")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    model = DFlashDrafter(config)
    state = {k: v.float() for k, v in _zlab_to_library(tensors, config, folder).items()}
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "mask_embedding"}
    wrong = [f"{k} {tuple(state[k].shape)} != {shape}" for k, shape in expected.items() if tuple(state[k].shape) != shape]
    if wrong:
        raise ValueError(f"{folder}: tensor shapes do not match config.json: {wrong[:3]}")
    model.load_state_dict(state, strict=False)  # mask_embedding stays unused (zeros): MASK is a token
    return model.requires_grad_(False)


# -- EAGLE-3 (EAGLE authors, SpecForge) --------------------------------------------------------------

def is_eagle3_published(config: dict) -> bool:
    """Whether a parsed ``config.json`` is a published EAGLE-3 drafter's (``LlamaForCausalLMEagle3``)."""
    return isinstance(config, dict) and EAGLE3_ARCHITECTURE in (config.get("architectures") or ())


def eagle3_published_config(raw: dict, source: str = "config.json") -> Eagle3Config:
    """The library's ``Eagle3Config`` for a published EAGLE-3 ``config.json``; errors name the field."""
    from .config import LlamaConfig

    if not is_eagle3_published(raw):
        archs = raw.get("architectures") if isinstance(raw, dict) else None
        hint = (" (a vLLM speculators export: its transformer_layer_config / speculators_config layout is not read)"
                if "Eagle3Speculator" in (archs or ()) else "")
        raise ValueError(f"{source}: not a published EAGLE-3 config (architectures {archs}, expected "
                         f"{EAGLE3_ARCHITECTURE!r}){hint}")
    if int(raw.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{source}: num_hidden_layers {raw['num_hidden_layers']}: EAGLE-3 drafters have one layer")
    for flag in ("attention_bias", "mlp_bias", "bias"):
        if raw.get(flag):
            raise ValueError(f"{source}: {flag} is not supported (EAGLE-3's projections have no bias)")
    # The layer is a Llama layer: parse (and check) the shared fields as the built-in model does.
    layer = LlamaConfig.from_hf_dict(dict(raw, model_type="llama", num_hidden_layers=1), source)
    if "draft_vocab_size" not in raw:
        raise ValueError(f"{source}: missing field 'draft_vocab_size'")
    eagle = raw.get("eagle_config") or {}
    layers = eagle.get("eagle_aux_hidden_state_layer_ids")
    target_hidden = raw.get("target_hidden_size")
    return Eagle3Config(
        hidden_size=layer.hidden_size, intermediate_size=layer.intermediate_size,
        num_attention_heads=layer.num_attention_heads, num_key_value_heads=layer.num_key_value_heads,
        head_dim=layer.head_dim, vocab_size=layer.vocab_size, draft_vocab_size=int(raw["draft_vocab_size"]),
        target_layers=None if layers is None else tuple(int(i) for i in layers),
        target_hidden_size=None if target_hidden is None else int(target_hidden),
        rms_norm_eps=layer.rms_norm_eps, rope_theta=layer.rope_theta, rope_scaling=dict(layer.rope_scaling),
        extra={"source": "published EAGLE-3 (LlamaForCausalLMEagle3)"})


def _eagle3_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files, else of its ``pytorch_model*.bin`` files."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    files = sorted(folder.glob("*.safetensors"))
    for file in files:
        tensors.update(load_file(str(file)))
    if not files:
        bins = sorted(folder.glob("pytorch_model*.bin"))
        if not bins:
            raise FileNotFoundError(f"{folder}: no EAGLE-3 weights (*.safetensors or pytorch_model.bin)")
        for file in bins:
            tensors.update(torch.load(file, map_location="cpu", weights_only=True))
    return tensors


def _eagle3_names(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Published names -> ``Eagle3Drafter``'s: a ``model.`` prefix dropped, ``layers.0.`` read as
    ``midlayer.``."""
    out = {}
    for name, value in tensors.items():
        if name.startswith("model."):
            name = name[len("model."):]
        if name.startswith("layers.0."):
            name = "midlayer." + name[len("layers.0."):]
        out[name] = value
    return out


def load_eagle3_published(folder: str | os.PathLike) -> Eagle3Drafter:
    """A published EAGLE-3 folder (module docstring) as an ``Eagle3Drafter`` (float32, CPU until
    ``attach``). Raises ValueError naming a config field or tensor it cannot reproduce."""
    folder = Path(folder)
    raw = _read_json(folder / "config.json")
    if raw is None:
        raise FileNotFoundError(f"{folder}: no config.json (not an EAGLE-3 drafter folder)")
    config = eagle3_published_config(raw, f"{folder}/config.json")
    tensors = _eagle3_names(_eagle3_tensors(folder))
    if "embed_tokens.weight" in tensors:
        config.own_embedding = True
    if "d2t" not in tensors and "t2d" not in tensors and config.draft_vocab_size == config.vocab_size:
        tensors["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.int64)  # the whole vocabulary
        tensors["t2d"] = torch.ones(config.vocab_size, dtype=torch.bool)
    model = Eagle3Drafter(config)
    return model.load_checked(tensors, str(folder)).requires_grad_(False)


__all__ = ("is_dflash_zlab", "is_eagle3_published", "is_medusa_fasterdecoding", "load_dflash", "load_dflash_zlab",
           "load_eagle3", "load_eagle3_published", "load_heads", "load_medusa_fasterdecoding", "dflash_zlab_config",
           "eagle3_published_config", "zlab_target_layer_ids")


# -- any layout -------------------------------------------------------------------------------------

def load_heads(folder: str | os.PathLike, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu") -> MedusaHeads | MTPModules:
    """Heads from a folder in any layout this library reads: a published FasterDecoding Medusa
    checkpoint, else one written by ``heads.save_heads`` (what ``method="medusa"`` / ``"mtp"``
    load from ``heads=<folder>``)."""
    if is_medusa_fasterdecoding(folder):
        return load_medusa_fasterdecoding(folder, dtype=dtype, device=device)
    return load_own_heads(folder, dtype=dtype, device=device)


def load_dflash(folder: str | os.PathLike) -> DFlashDrafter:
    """A DFlash drafter from a folder in any layout this library reads: a published z-lab folder,
    else one written by ``DFlashDrafter.save`` (what ``method="dflash"`` / ``"ddtree"`` load from
    ``drafter=<folder>``)."""
    config = Path(folder) / "config.json"
    if config.is_file():
        try:
            raw = json.loads(config.read_text())
        except ValueError:
            raw = None
        if isinstance(raw, dict) and is_dflash_zlab(raw):
            return load_dflash_zlab(folder)
    return DFlashDrafter.load(folder)


def load_eagle3(folder: str | os.PathLike) -> Eagle3Drafter:
    """An EAGLE-3 drafter from a folder in any layout this library reads: one written by
    ``Eagle3Drafter.save``, else a published EAGLE / SpecForge folder (what ``method="eagle3"``
    loads from ``drafter=<folder>``)."""
    raw = _read_json(Path(folder) / "config.json")
    if isinstance(raw, dict) and raw.get("model_type") == EAGLE3_MODEL_TYPE:
        return Eagle3Drafter.load(folder)
    if raw is None:
        raise FileNotFoundError(f"{folder}: no config.json (not an EAGLE-3 drafter folder)")
    return load_eagle3_published(folder)
