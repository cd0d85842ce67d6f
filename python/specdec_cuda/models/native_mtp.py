"""MTP layers that ship inside checkpoints: found by ``detect``, run by ``method="mtp"`` with no options.

Several model families train multi-token-prediction layers with the model and publish them in the
checkpoint. The layouts (config key, tensor names per MTP layer ``i``; ``N`` = num_hidden_layers):

* **MiMo** (Xiaomi MiMo-7B; config ``num_nextn_predict_layers``; tensors ``model.mtp_layers.{i}.*``):
  ``token_layernorm`` (on the next token's embedding), ``hidden_layernorm`` (on the previous depth's
  hidden state), ``input_proj`` [H, 2H] over ``[hidden; embedding]`` (hidden first), one Qwen2
  decoder block (``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``post_attention_layernorm``,
  ``mlp.*``), ``final_layernorm``, then the model's own LM head. The first depth reads the main
  model's final normed hidden state; a depth after it reads the previous module's output after its
  ``final_layernorm``.
* **DeepSeek-V3 / R1** and **GLM-4.5** (``num_nextn_predict_layers``; tensors ``model.layers.{N + i}.*``):
  ``enorm``, ``hnorm``, ``eh_proj`` [H, 2H] over ``[embedding; hidden]``, one decoder block of the
  model's own kind (DeepSeek: multi-head latent attention and a mixture of experts; GLM-4.5: a
  mixture of experts), ``shared_head.norm`` and ``shared_head.head`` (the model's LM head).
* **Qwen3-Next / Qwen3.5** (tensors ``mtp.*``): ``mtp.pre_fc_norm_embedding``,
  ``mtp.pre_fc_norm_hidden``, ``mtp.fc`` [H, 2H] over ``[embedding; hidden]``, ``mtp.layers.{i}.*``
  (a gated-attention, mixture-of-experts block), ``mtp.norm``; its norms are zero-centred
  (weight + 1).

The built-in model runs dense Llama / Qwen2 / Qwen3 blocks, so it runs MiMo's layers
(``models.heads.MTPModules`` with the checkpoint's final norms and chaining rule, ``eh_proj``'s two
halves put in this project's [embedding | hidden] order). The other three layouts run on targets
loaded with ``transformers`` (``models.HFCausalLM``: their main models' blocks are kinds the built-in
model does not have), each MTP layer's block built from transformers' own decoder-layer class of
the architecture (``models.native_mtp_hf``, which also states each forward exactly).
``python -m specdec_cuda methods --model DIR`` reports what a folder carries and on which backend.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from .config import LlamaConfig, UnsupportedModelError
from .heads import MTPModules


@dataclass(frozen=True)
class NativeMTP:
    """The MTP layers a checkpoint carries: ``layout`` (``mimo``, ``deepseek_v3``, ``glm4_moe``,
    ``qwen3_next``), how many, and the backend that runs them: ``"builtin"`` (the built-in model,
    ``models.load``) or ``"transformers"`` (``models.HFCausalLM``)."""

    layout: str
    num_layers: int
    backend: str

    def describe(self) -> str:
        what = f"{self.num_layers} MTP layer{'s' if self.num_layers != 1 else ''} ({self.layout} layout)"
        return what + ("" if self.backend == "builtin" else
                       f", run on the transformers adapter: {_BLOCKS[self.layout]}")


_BLOCKS = {
    "deepseek_v3": "multi-head latent attention and mixture-of-experts blocks",
    "glm4_moe": "mixture-of-experts blocks",
    "qwen3_next": "gated-attention and mixture-of-experts blocks, zero-centred norms",
}


def detect(config: Mapping, names: Iterable[str]) -> NativeMTP | None:
    """The MTP layers in a checkpoint of ``config`` (config.json as a dict) whose tensors are
    ``names``; None when it has none."""
    names = list(names)
    model_type = str(config.get("model_type", ""))
    mimo = {int(m.group(1)) for n in names if (m := re.match(r"model\.mtp_layers\.(\d+)\.", n))}
    if mimo:
        return NativeMTP("mimo", max(mimo) + 1, "builtin")
    if any(n.startswith("mtp.") for n in names):
        count = {int(m.group(1)) for n in names if (m := re.match(r"mtp\.layers\.(\d+)\.", n))}
        return NativeMTP("qwen3_next", max(count, default=0) + 1, "transformers")
    nextn = int(config.get("num_nextn_predict_layers", 0) or 0)
    num_layers = int(config.get("num_hidden_layers", 0) or 0)
    if nextn > 0 and any(n.startswith(f"model.layers.{num_layers}.eh_proj") for n in names):
        layout = "glm4_moe" if model_type.startswith("glm") else "deepseek_v3"
        return NativeMTP(layout, nextn, "transformers")
    return None


def load_mimo(tensors: Mapping[str, torch.Tensor], config: LlamaConfig, count: int,
              dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> MTPModules:
    """MiMo's ``count`` MTP layers from ``tensors`` (HF names) as ``MTPModules`` for a target of
    ``config`` (their blocks have the target's sizes). ValueError for a missing or misshapen tensor."""
    import dataclasses

    from .llama import decoder_layer_hf_layout

    modules = MTPModules(dataclasses.replace(config, num_hidden_layers=1), count, dtype, device,
                         final_norm=True, chain_normed=True)
    H = config.hidden_size

    def read(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in tensors:
            raise ValueError(f"MiMo MTP layer: tensor {name} is missing")
        t = tensors[name]
        if tuple(t.shape) != shape:
            raise ValueError(f"MiMo MTP layer: tensor {name} has shape {tuple(t.shape)}, expected {shape}")
        return t

    with torch.no_grad():
        for i, m in enumerate(modules.modules_):
            p = f"model.mtp_layers.{i}."
            m.enorm_weight.copy_(read(p + "token_layernorm.weight", (H,)))
            m.hnorm_weight.copy_(read(p + "hidden_layernorm.weight", (H,)))
            proj = read(p + "input_proj.weight", (H, 2 * H))  # columns: [hidden | embedding]
            m.eh_proj[:, :H] = proj[:, H:]  # this project's order: [embedding | hidden]
            m.eh_proj[:, H:] = proj[:, :H]
            modules.final_norms[i].copy_(read(p + "final_layernorm.weight", (H,)))
            for name, (param, off, rows) in decoder_layer_hf_layout(m.block, config, p).items():
                param[off : off + rows].copy_(read(name, (rows, *param.shape[1:])))
    return modules.requires_grad_(False)


def native_modules(target):
    """The MTP modules of ``target``'s own checkpoint (the folder ``models.load`` records, or for an
    ``HFCausalLM`` the one transformers read), in its dtype and device: ``MTPModules`` (MiMo, on the
    built-in model) or ``native_mtp_hf.HFMTPModules`` (DeepSeek-V3, GLM-4.5, Qwen3-Next, on an
    ``HFCausalLM``). FileNotFoundError saying what the checkpoint has when it has none to run;
    UnsupportedModelError when the layers need the other backend."""
    from ..drafters import target_folder, train_command

    folder = target_folder(target)
    if folder is None:
        raise FileNotFoundError("no MTP heads given, none in the drafter cache for this target, and it was not "
                                "loaded from a checkpoint folder (specdec_cuda.models.load, or transformers' "
                                "from_pretrained): pass heads=<folder or MTPModules> trained for it, or train them "
                                f"with `{train_command(target, 'mtp')}`")
    from .hf_adapter import HFCausalLM
    from .loader import SafetensorsFolder, read_checkpoint_config

    folder, _, raw = read_checkpoint_config(folder, "a Hugging Face checkpoint folder")
    tensors = SafetensorsFolder(folder)
    found = detect(raw, tensors)
    if found is None:
        raise FileNotFoundError(f"no MTP heads given, none in the drafter cache for this target, and {folder} "
                                f"carries no MTP layers (MiMo, DeepSeek-V3, GLM-4.5 or Qwen3-Next layouts): pass "
                                f"heads=<folder or MTPModules> trained for it, or train them with "
                                f"`{train_command(target, 'mtp')}`")
    if found.backend == "transformers":
        if not isinstance(target, HFCausalLM):
            raise UnsupportedModelError(
                f"{folder} carries {found.describe()}; the built-in model does not run them: load the folder "
                f"with transformers (AutoModelForCausalLM.from_pretrained) and pass the model or "
                f"specdec_cuda.models.HFCausalLM(model) as the target")
        from .native_mtp_hf import load_hf_mtp

        return load_hf_mtp(target, tensors, found.layout, found.num_layers)
    if isinstance(target, HFCausalLM):
        raise UnsupportedModelError(f"{folder} carries {found.describe()}, whose blocks the built-in model runs: "
                                    f"load it with specdec_cuda.models.load")
    return load_mimo(tensors, target.config, found.num_layers, dtype=target.dtype, device=target.device)
