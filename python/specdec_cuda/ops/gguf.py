"""GGUF quantized weights read as stored in the file: ``gguf_matmul``, ``gguf_linear`` (several
weights concatenated along N, as a model's fused projections), ``gguf_rows`` and ``gguf_dequantize``.

A ``.gguf`` file keeps each quantized weight ``W [N, K]`` as N rows of ``K / QK`` blocks (fp16
scales + packed codes; layouts in ``specdec_cuda.reference.gguf``). These ops take those bytes as
they are, a ``uint8`` tensor ``[N, K / QK * block_bytes]``, so a decoding step streams 4.5 bits
per weight for Q4_K instead of 16 for bf16. Formats, by GGML type id (``gguf.GGMLQuantizationType``
values are accepted too): Q4_1 (3), Q5_0 (6), Q8_0 (8), Q4_K (12), Q6_K (14); and Q4_K_LANES (268) /
Q6_K_LANES (270), a Q4_K / Q6_K weight repacked for the CPU's int8 kernel (``gguf_repack_lanes``).

``gguf_matmul`` accumulates in float32 on the CPU with an order that depends only on K: a row of
``x`` gives the same bits alone or in a batch of any size (one-token decoding and a verification
forward agree, so greedy speculative decoding is exact), and the AVX-512, AVX2 and portable
kernels give the same bits. ``gguf_dequantize`` equals ``gguf.quants.dequantize`` bit for bit.

``gguf_matmul(x, w, activations="q8")`` first rounds each 32-value block of a row of ``x`` to int8
with one float32 scale (``quantize_q8``; format in ``csrc/kernels/gguf/q8.h``), then runs integer
dot products: 1.3-2x the float32-activation kernel's weight bandwidth at one row on AVX2 and
1.4-2.6x at 5-64 rows (``bench/bench_gguf.py``; a whole Qwen2.5-1.5B Q4_K_M step 1.8x), at a
relative error of ~1e-2 of ``max|x|·|W|``. Its order also depends only on K (rows independent, tiers
agree bit for bit), and ``reference.gguf.matmul_q8`` reproduces it bit for bit. CPU only.

``gguf_linear(x, w, activations="bf16")`` (CPUs with AMX-BF16: ``bf16_tiles_available()``) rounds x
and the dequantised weight to bfloat16 and multiplies them on AMX tiles with float32 accumulation:
a prompt's prefill at ~4x the Q8 kernel's speed (``csrc/kernels/gguf/bf16_amx.h``). Rows stay
independent, but the bits are not those of the other two modes, so a model uses it for prompts only
(``LlamaModel.forward(prefill=True)``), never for the rows a verification compares with decoding.

``gguf_linear(x, w, activations="q8k")`` is the prompt's mode on CPUs with AVX-512 VNNI and no AMX
(``q8k_prefill_pays()``): x rounded to int8 with one scale per 256 values, the k-quants' sub-block
scales applied in integers, 16 outputs in the vector lanes (``csrc/kernels/gguf/q8k.h``;
``reference.gguf.matmul_q8k`` reproduces it bit for bit); parts in a legacy format (Q8_0, Q5_0,
Q4_1) multiply x's Q8 form with the same 16-outputs tiling, one float step per block in one
accumulator. Its own numeric contract, for prompts only, like "bf16".

``gguf_linear(x, w, activations="q8k_q8")``: the k-quant parts in "q8k"'s order, the legacy ones in
"q8"'s, every row a one-row call's bits: how a model decodes and verifies where its weights are held
in panels of 16 rows (``gguf_repack_panels``, ``panels_pay()``), which the VNNI kernels read at
every row count (a 5-row verification of the 1.5B at 1.13x a one-token step instead of 1.6x).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import _native  # noqa: F401  (registers the ops)
from ..reference import gguf as ref

__all__ = ["GgufWeight", "GgufLinear", "gguf_weight", "gguf_matmul", "gguf_linear", "gguf_dequantize", "gguf_rows",
           "gguf_repack_lanes", "lanes_pay", "q8k_prefill_pays", "Q4_K_LANES_ID", "Q6_K_LANES_ID", "quantize_q8", "q8_row_bytes",
           "gguf_repack_panels", "panels_pay", "Q4_K_PANELS_ID", "Q6_K_PANELS_ID",
           "FORMATS", "ACTIVATIONS", "LINEAR_ACTIVATIONS", "cpu_isa", "q8_cpu_isa", "bf16_tiles_available"]

FORMATS = ref.FORMATS
ACTIVATIONS = ("float32", "q8")  # gguf_matmul's activation modes
# gguf_linear's (and decoder_layer_gguf's): + the prefill kernels, and "q8k_q8" (k-quant parts Q8K,
# legacy parts Q8: the decoding mode of a model whose k-quants are panels)
LINEAR_ACTIVATIONS = ACTIVATIONS + ("bf16", "q8k", "q8k_q8")
q8_row_bytes = ref.q8_row_bytes
Q4_K_LANES_ID, Q6_K_LANES_ID = ref.Q4_K_LANES, ref.Q6_K_LANES  # gguf_repack_lanes's type ids: not GGML types
Q4_K_PANELS_ID, Q6_K_PANELS_ID = ref.Q4_K_PANELS, ref.Q6_K_PANELS  # gguf_repack_panels's
_NAMES = {name: qtype for qtype, (name, _, _) in FORMATS.items()}


class GgufWeight(NamedTuple):
    """A GGUF weight ready for ``gguf_matmul``: its blocks' bytes, type id and shape ``[N, K]``."""

    data: torch.Tensor  # uint8 [N, K / QK * block_bytes]
    qtype: int
    out_features: int
    in_features: int


class GgufLinear(NamedTuple):
    """A weight ``[N, K]`` held as GGUF weights concatenated along its outputs (``parts``, each
    ``[N_p, K]``, in any of the formats): how a model keeps a fused projection whose pieces the file
    quantised separately (q, k, v: Qwen2.5's Q4_K_M file has v in Q6_K where q and k are Q4_K).
    ``activations``: how ``gguf_linear`` multiplies it by default, one of ``LINEAR_ACTIVATIONS``:
    "float32" or "q8" (see ``gguf_matmul``), or "q8k_q8" (the k-quant parts in Q8K, the legacy ones
    in Q8: a model whose weights are panels, ``panels_pay()``)."""

    parts: tuple[GgufWeight, ...]
    activations: str = "float32"

    @property
    def out_features(self) -> int:
        return sum(p.out_features for p in self.parts)

    @property
    def in_features(self) -> int:
        return self.parts[0].in_features

    @property
    def nbytes(self) -> int:
        return sum(p.data.numel() for p in self.parts)

    @staticmethod
    def of(*parts: GgufWeight, activations: str = "float32") -> "GgufLinear":
        """The concatenation of ``parts`` (one ``in_features``; at least one part)."""
        if not parts or not all(isinstance(p, GgufWeight) for p in parts):
            raise TypeError("GgufLinear.of takes one or more GgufWeight parts")
        if len({p.in_features for p in parts}) != 1:
            raise ValueError(f"the parts of a GgufLinear must share in_features; got {[p.in_features for p in parts]}")
        _activation_code(activations)
        return GgufLinear(tuple(parts), activations)


def _activation_code(activations: str) -> int:
    """0 for "float32", 1 for "q8" (the ops' ``activations`` argument); 2 for "bf16" (AMX tiles),
    which only ``gguf_linear`` and the GGUF decoder layer take, and only where
    ``bf16_tiles_available()``; 3 for "q8k" (the Q8K prefill kernel: those two ops, any CPU, fast
    where ``q8k_prefill_pays()``); 4 for "q8k_q8" (those two ops: k-quant parts in Q8K, legacy
    parts in Q8, every row the bits of a one-row call: decoding where ``panels_pay()``)."""
    if activations not in LINEAR_ACTIVATIONS:
        raise ValueError(f"activations must be one of {LINEAR_ACTIVATIONS}, got {activations!r}")
    if activations == "bf16" and not bf16_tiles_available():
        raise ValueError("activations='bf16' runs on AMX tiles; this CPU (or SPECDEC_CPU_ISA) has none "
                         "(bf16_tiles_available() is False)")
    return LINEAR_ACTIVATIONS.index(activations)


def q8k_prefill_pays() -> bool:
    """Whether a prompt's prefill should run ``activations="q8k"`` here: a CPU whose Q8 kernel is
    the AVX-512 VNNI tier and that has no AMX tiles (those prefill on ``"bf16"``): the Q8K kernel's
    VNNI tier then multiplies a prompt at ~2x the decoding kernels' speed (``csrc/kernels/gguf/q8k.h``).
    Elsewhere ``"q8k"`` runs too, on its portable tier, but slower than ``"q8"``."""
    return lanes_pay()


def bf16_tiles_available() -> bool:
    """Whether ``gguf_linear(..., activations="bf16")`` can run here: a CPU with AMX-BF16 that the
    process may use and ``SPECDEC_CPU_ISA`` allows (the test of the packed bfloat16 panels' AMX tier)."""
    from .skinny_linear import packed_bf16_tier

    return packed_bf16_tier() == "amx"


def _qtype(qtype) -> int:
    if isinstance(qtype, str):
        if qtype.upper() not in _NAMES:
            raise ValueError(f"unsupported GGUF type {qtype!r}; supported: {', '.join(_NAMES)}")
        return _NAMES[qtype.upper()]
    q = int(qtype)  # gguf.GGMLQuantizationType is an IntEnum
    if q not in FORMATS:
        raise ValueError(f"unsupported GGML type id {q}; supported: "
                         + ", ".join(f"{n} ({t})" for t, (n, _, _) in FORMATS.items()))
    return q


def gguf_weight(data, qtype, shape: tuple[int, int]) -> GgufWeight:
    """Wrap a tensor's blocks (e.g. ``gguf.GGUFReader(...).tensors[i].data``) as a ``GgufWeight``.

    Parameters
    ----------
    data : Tensor or numpy array
        The blocks' bytes, uint8. Shape: ``[N, K / QK * block_bytes]`` or flat.
    qtype : int, str or gguf.GGMLQuantizationType
        The format: 3 / "Q4_1", 6 / "Q5_0", 8 / "Q8_0", 12 / "Q4_K", 14 / "Q6_K".
    shape : (int, int)
        ``(N, K)`` = (out_features, in_features) in torch order (a GGUF tensor lists them the other
        way round: ``ne = [K, N]``).

    Example
    -------
    >>> w = gguf_weight(torch.zeros(4, 144, dtype=torch.uint8), "Q4_K", (4, 256))
    >>> gguf_matmul(torch.randn(2, 256), w).shape
    torch.Size([2, 4])
    """
    q = _qtype(qtype)
    t = data if isinstance(data, torch.Tensor) else torch.as_tensor(data)
    if t.dtype != torch.uint8:
        raise TypeError(f"data must be the uint8 bytes of the blocks, got {t.dtype}")
    n, k = (int(s) for s in shape)
    name, qk, nbytes = FORMATS[q]
    if n < 0 or k <= 0 or k % qk:
        raise ValueError(f"{name} weights need in_features to be a positive multiple of {qk}; got shape [{n}, {k}]")
    rb = k // qk * nbytes
    if t.numel() != n * rb:
        raise ValueError(f"a {name} weight [{n}, {k}] is {n} x {rb} bytes; data has {t.numel()} "
                         f"(shape {tuple(t.shape)})")
    t = t.reshape(n, rb)
    if not t.is_contiguous() or t.data_ptr() % 2:
        t = t.contiguous() if not t.is_contiguous() else t.clone()
    return GgufWeight(t, q, n, k)


def gguf_matmul(x: torch.Tensor, weight: GgufWeight, activations: str = "float32") -> torch.Tensor:
    """``x · dequant(W)ᵀ``, accumulated in float32 and rounded once to x's dtype.

    Parameters
    ----------
    x : Tensor
        Shape: ``[..., K]``; float32, bfloat16 or float16 (widened exactly), on W's device.
    weight : GgufWeight
        From ``gguf_weight``.
    activations : {"float32", "q8"}
        ``"float32"``: x as it is (error ~1e-7 of ``max|x|·|W|``). ``"q8"``: x rounded to int8 per
        32-value block first (``quantize_q8``), integer dot products (faster; error ~1e-2 of
        ``max|x|·|W|``; K a multiple of 32, which every format's block is); CPU only.

    Returns
    -------
    Tensor
        Shape: ``[..., N]``, x's dtype (freshly allocated).

    Example
    -------
    >>> w = gguf_weight(torch.zeros(3, 34, dtype=torch.uint8), "Q8_0", (3, 32))
    >>> gguf_matmul(torch.randn(5, 32), w).shape
    torch.Size([5, 3])
    >>> gguf_matmul(torch.randn(5, 32), w, activations="q8").shape
    torch.Size([5, 3])
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if not isinstance(weight, GgufWeight):
        raise TypeError(f"weight must be a GgufWeight (from gguf_weight), got {type(weight).__name__}")
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(map(repr, ACTIVATIONS))}; got {activations!r}")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != weight.in_features:
        raise ValueError(f"x must be [..., {weight.in_features}] for this weight; got shape {tuple(x.shape)}")
    if x.device != weight.data.device:
        raise ValueError(f"x is on {x.device} but the weight is on {weight.data.device}")
    if activations == "q8" and x.device.type != "cpu":
        raise ValueError(f"activations='q8' runs on the CPU only; x and the weight are on {x.device}")
    shape = x.shape
    x2 = x.contiguous() if x.dim() == 2 else x.reshape(-1, weight.in_features).contiguous()
    out = x2.new_empty((x2.shape[0], weight.out_features))
    op = torch.ops.specdec.gguf_matmul_q8 if activations == "q8" else torch.ops.specdec.gguf_matmul
    op(x2, weight.data, weight.qtype, out)
    return out if x.dim() == 2 else out.reshape(*shape[:-1], weight.out_features)


def gguf_linear(x: torch.Tensor, weight: GgufLinear, bias: torch.Tensor | None = None,
                activations: str | None = None) -> torch.Tensor:
    """``x · Wᵀ + bias`` in float32 with W the concatenation of ``weight.parts`` (CPU): what a GGUF
    model's LM head and fused projections run. Each output is ``gguf_matmul``'s bits for its part
    with the same ``activations`` (default: the weight's own, ``weight.activations``), then + bias:
    a row of x gets the same result alone or in a batch, on any thread count. ``activations="bf16"``
    (AMX CPUs): x and W rounded to bfloat16, tile products with float32 sums (module docstring).

    Shape: x ``[..., K]`` float32; bias ``[N]`` float32 or None; returns ``[..., N]`` float32.

    Example
    -------
    >>> q = gguf_weight(torch.zeros(4, 144, dtype=torch.uint8), "Q4_K", (4, 256))
    >>> v = gguf_weight(torch.zeros(2, 210, dtype=torch.uint8), "Q6_K", (2, 256))
    >>> gguf_linear(torch.randn(3, 256), GgufLinear.of(q, v)).shape
    torch.Size([3, 6])
    """
    if not isinstance(weight, GgufLinear):
        raise TypeError(f"weight must be a GgufLinear, got {type(weight).__name__}")
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.device.type != "cpu":
        raise TypeError(f"x must be a float32 CPU tensor, got {getattr(x, 'dtype', type(x).__name__)} "
                        f"on {getattr(x, 'device', '?')}")
    if x.dim() == 0 or x.shape[-1] != weight.in_features:
        raise ValueError(f"x must be [..., {weight.in_features}] for this weight; got shape {tuple(x.shape)}")
    x2 = x.reshape(-1, weight.in_features).contiguous()
    out = x2.new_empty((x2.shape[0], weight.out_features))
    mode = _activation_code(weight.activations if activations is None else activations)
    if mode >= 1 and weight.in_features % 32:
        raise ValueError(f"{LINEAR_ACTIVATIONS[mode]} activations need in_features to be a multiple of 32; got "
                         f"{weight.in_features}")
    torch.ops.specdec.gguf_linear(x2, [p.data for p in weight.parts], [p.qtype for p in weight.parts],
                                  None if bias is None else bias.float().contiguous(), mode, out)
    return out.reshape(*x.shape[:-1], weight.out_features)


def gguf_rows(weight: GgufWeight, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` of ``dequant(W)`` in float32, decoding only those rows' blocks: an embedding
    lookup straight from a GGUF ``token_embd`` (exactly ``gguf_dequantize(weight)[index]``).

    Shape: index ``[...]`` int64 -> ``[..., K]`` float32.
    """
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= weight.out_features):
        raise IndexError(f"row index out of range [0, {weight.out_features}): got "
                         f"{int(index.min())} .. {int(index.max())}")
    flat = index.reshape(-1).to(device=weight.data.device, dtype=torch.long)
    if weight.qtype in ref.FILE_OF_PANELS:  # the groups of 16 that hold the rows, back in the file's order
        groups = torch.unique(flat // 16)
        rb = weight.data.shape[-1]
        held = weight.data.reshape(-1, 16 * rb).index_select(0, groups).reshape(-1, rb)
        weight = gguf_repack_panels(GgufWeight(held, weight.qtype, held.shape[0], weight.in_features), inverse=True)
        flat = torch.searchsorted(groups, flat // 16) * 16 + flat % 16
    rows = GgufWeight(weight.data.index_select(0, flat), weight.qtype, flat.numel(), weight.in_features)
    return gguf_dequantize(rows).reshape(*index.shape, weight.in_features)


def quantize_q8(x: torch.Tensor) -> torch.Tensor:
    """The Q8 activation rows of ``x`` (what ``activations="q8"`` multiplies), as raw bytes.

    Each row of K values (K a multiple of 32) becomes ``q8_row_bytes(K)`` bytes: int8 codes [K],
    float32 scales [8 T], int16 half sums [16 T], zero padding (T = ceil(K / 256); format in
    ``csrc/kernels/gguf/q8.h``, specified by ``reference.gguf.quantize_q8``). CPU only.

    Shape: ``x`` ``[M, K]`` float32 / bfloat16 / float16; returns uint8 ``[M, q8_row_bytes(K)]``.

    Example
    -------
    >>> quantize_q8(torch.randn(2, 256)).shape
    torch.Size([2, 320])
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"x must be a [M, K] tensor; got {getattr(x, 'shape', type(x).__name__)}")
    if x.shape[1] <= 0 or x.shape[1] % 32:
        raise ValueError(f"K must be a positive multiple of 32; got x shape {tuple(x.shape)}")
    out = torch.empty(x.shape[0], q8_row_bytes(x.shape[1]), dtype=torch.uint8, device=x.device)
    torch.ops.specdec.gguf_quantize_q8(x, out)
    return out


def gguf_dequantize(weight: GgufWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dense weight ``dequant(W)``.

    Shape: ``[N, K]`` in ``dtype`` (float32 exact; bfloat16 / float16 rounded once to nearest even;
    float16 only on CUDA), on the weight's device.

    Example
    -------
    >>> w = gguf_weight(torch.zeros(2, 22, dtype=torch.uint8), "Q5_0", (2, 32))
    >>> gguf_dequantize(w).shape
    torch.Size([2, 32])
    """
    if not isinstance(weight, GgufWeight):
        raise TypeError(f"weight must be a GgufWeight (from gguf_weight), got {type(weight).__name__}")
    out = torch.empty(weight.out_features, weight.in_features, dtype=dtype, device=weight.data.device)
    torch.ops.specdec.gguf_dequantize(weight.data, weight.qtype, out)
    return out


def gguf_repack_lanes(weight: GgufWeight) -> GgufWeight:
    """A Q4_K or Q6_K weight repacked for the CPU's int8-activation kernel: type ``Q4_K_LANES`` (268)
    or ``Q6_K_LANES`` (270), the same blocks with each one's 256 codes permuted
    (``reference.gguf.to_lanes``), so the AVX-512 VNNI tier's lane dots multiply them as loaded
    instead of transposing every block, at one row of x as at many. Values and results are the file
    format's, bit for bit, in every op (``gguf_dequantize``, both activation modes, CUDA); only the
    VNNI Q8 kernel reads the order natively, every other path turns it back first. Q4_K on a Zen 4
    EPYC, 2 threads, Qwen2.5-1.5B Q4_K_M: one-token step 38-39 -> 35.5 ms, 5-row verification
    73 -> 67 ms, 168-token prefill 1.80 -> 1.68 s (medians of three alternating processes). Other
    formats, and weights on other devices, are returned as they are.

    Example
    -------
    >>> w = gguf_weight(torch.zeros(4, 144, dtype=torch.uint8), "Q4_K", (4, 256))
    >>> gguf_repack_lanes(w).qtype
    268
    """
    if not isinstance(weight, GgufWeight):
        raise TypeError(f"weight must be a GgufWeight (from gguf_weight), got {type(weight).__name__}")
    if weight.qtype not in ref.LANES or weight.data.device.type != "cpu":
        return weight
    out = torch.empty_like(weight.data)
    torch.ops.specdec.gguf_repack_lanes(weight.data, weight.qtype, weight.in_features, out)
    return GgufWeight(out, ref.LANES[weight.qtype], weight.out_features, weight.in_features)


def gguf_repack_panels(weight: GgufWeight, inverse: bool = False) -> GgufWeight:
    """A GGUF weight (``out_features`` a multiple of 16) in panels of 16 rows: type 512 + its format
    (``Q4_K_PANELS`` 524, ``Q6_K_PANELS`` 526, Q8_0 520, Q5_0 518, Q4_1 515), the same bytes
    permuted so that a step of the VNNI lanes kernels (4 codes of 16 rows) is one load
    (``reference.gguf.to_panels``; ``csrc/kernels/gguf/panels.h``). ``gguf_linear`` and the GGUF
    decoder layer read it in every mode (the int8 modes natively on a VNNI CPU: the k-quants in the
    Q8K order, the legacy formats in Q8's or the prefill's; the others through the file's order),
    ``gguf_dequantize`` and ``gguf_rows`` too; ``gguf_matmul`` and CUDA refuse it. ``inverse=True``
    turns panels back into the file's blocks. Other layouts, other devices and row counts that are
    not whole groups are returned as they are.

    Example
    -------
    >>> w = gguf_weight(torch.zeros(16, 144, dtype=torch.uint8), "Q4_K", (16, 256))
    >>> gguf_repack_panels(w).qtype
    524
    """
    if not isinstance(weight, GgufWeight):
        raise TypeError(f"weight must be a GgufWeight (from gguf_weight), got {type(weight).__name__}")
    table = ref.FILE_OF_PANELS if inverse else ref.PANELS
    if weight.qtype not in table or weight.data.device.type != "cpu" or weight.out_features % 16:
        return weight
    out = torch.empty_like(weight.data)
    torch.ops.specdec.gguf_repack_panels(weight.data, weight.qtype, weight.in_features, inverse, out)
    return GgufWeight(out, table[weight.qtype], weight.out_features, weight.in_features)


def panels_pay() -> bool:
    """Whether a model's GGUF weights should be held as panels (``gguf_repack_panels``) and decoded
    in ``activations="q8k_q8"``: where the VNNI lanes kernels run (the Q8 kernel's AVX-512 VNNI
    tier), with or without AMX (a prompt's AMX tiles read panels too: ``bf16_amx_panels.cpp``). At
    one row of x they stream faster than the Q8 kernels (Qwen2.5-Coder-1.5B Q4_K_M, 2 threads: 41.3
    -> 40.5 ms on a Zen 4 EPYC, 55.5 -> 46.6 ms on a Sapphire Rapids-class Xeon), and a
    verification's extra rows cost a third to a half as much (``csrc/kernels/gguf/q8k.h``)."""
    return q8_cpu_isa() == "avx512-vnni"


def lanes_pay() -> bool:
    """Whether a model's Q4_K and Q6_K weights should be repacked (``gguf_repack_lanes``) in this
    process: its Q8 kernel is the AVX-512 VNNI tier, and no AMX prefill decodes the same blocks (the
    tiles' decoder reads the file's order; on a lane-order weight it would turn each block back)."""
    return q8_cpu_isa() == "avx512-vnni" and not bf16_tiles_available()


def cpu_isa() -> str:
    """The CPU matmul kernel this process runs: "avx512", "avx2" or "portable" (SPECDEC_CPU_ISA caps it)."""
    code = torch.zeros(1, dtype=torch.int32)
    torch.ops.specdec._gguf_cpu_isa(code)
    return ("portable", "avx2", "avx512")[int(code)]


def q8_cpu_isa() -> str:
    """The CPU kernel ``activations="q8"`` runs: "avx512-vnni", "avx512", "avx2" or "portable"
    (SPECDEC_CPU_ISA caps it: "avx512-novnni", "avx2", "baseline")."""
    code = torch.zeros(1, dtype=torch.int32)
    torch.ops.specdec._gguf_q8_cpu_isa(code)
    return ("portable", "avx2", "avx512", "avx512-vnni")[int(code)]


@torch.library.register_fake("specdec::gguf_matmul")
def _gguf_matmul_fake(x, weight, qtype, out):
    return None


@torch.library.register_fake("specdec::gguf_dequantize")
def _gguf_dequantize_fake(weight, qtype, out):
    return None


@torch.library.register_fake("specdec::gguf_repack_lanes")
def _gguf_repack_lanes_fake(weight, qtype, k, out):
    return None


@torch.library.register_fake("specdec::gguf_repack_panels")
def _gguf_repack_panels_fake(weight, qtype, k, inverse, out):
    return None


@torch.library.register_fake("specdec::gguf_linear")
def _gguf_linear_fake(x, weights, types, bias, activations, out):
    return None


@torch.library.register_fake("specdec::_gguf_cpu_isa")
def _gguf_cpu_isa_fake(code):
    return None


@torch.library.register_fake("specdec::gguf_matmul_q8")
def _gguf_matmul_q8_fake(x, weight, qtype, out):
    return None


@torch.library.register_fake("specdec::gguf_quantize_q8")
def _gguf_quantize_q8_fake(x, out):
    return None


@torch.library.register_fake("specdec::_gguf_q8_cpu_isa")
def _gguf_q8_cpu_isa_fake(code):
    return None
