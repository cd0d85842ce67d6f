"""specdec_cuda: lossless speculative decoding for PyTorch causal LMs.

Hand-written C++ / CUDA kernels for the hot parts (verification, rejection sampling, tree masks,
4-bit matmul) under ``specdec_cuda.ops``, their plain-PyTorch specification under
``specdec_cuda.reference``, and an orchestrator that runs every decoding method on any causal LM.
"""

from __future__ import annotations

from . import _native
from . import ops
from .api import InexactVerificationWarning, SpeculativeDecoder, generate
from .outputs import GenerationResult, Metrics

__version__ = _native._C.build_info()["version"]


def build_info() -> dict:
    """What the loaded binary was built against.

    Returns a dict with ``version``, ``torch_version`` (the torch the binary was compiled against),
    ``with_cuda`` (whether CUDA kernels are in), ``cuda_archs`` (e.g. ``"8.0;9.0"``),
    ``cuda_version`` (torch's CUDA at build time or None), ``debug`` and, when CUDA kernels are not
    in, ``cuda_skipped_because``.
    """
    info = dict(_native._C.build_info())
    meta = _native._build_meta
    info["cuda_version"] = meta.TORCH_CUDA_VERSION
    info["debug"] = meta.DEBUG
    if not info["with_cuda"]:
        info["cuda_skipped_because"] = meta.CUDA_REASON
    return info


__all__ = ["GenerationResult", "InexactVerificationWarning", "Metrics", "SpeculativeDecoder", "build_info", "generate", "ops", "__version__"]
