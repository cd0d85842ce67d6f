"""Loads the compiled extension after checking it was built for the torch in this process.

A binary built against another torch would fail with an `undefined symbol` deep inside the
dynamic loader; the check below turns that into a message naming both versions.
"""

from __future__ import annotations

import torch

try:
    from . import _build_meta
except ImportError as exc:  # source tree without a build
    raise ImportError(
        "specdec_cuda has not been built: run `pip install --no-build-isolation -e .` (or "
        "`python setup.py build_ext --inplace`) in the repository root"
    ) from exc


def _same_torch(built: str, running: str) -> bool:
    # Local version labels (+cu130, +cpu) do not change the C++ ABI of a release; compare the rest.
    return built.split("+")[0] == running.split("+")[0]


if not _same_torch(_build_meta.TORCH_VERSION, torch.__version__):
    raise ImportError(
        f"specdec_cuda was built against torch {_build_meta.TORCH_VERSION} but this process runs "
        f"torch {torch.__version__}; rebuild it with `pip install --no-build-isolation .` in this "
        "environment"
    )

from . import _C  # noqa: E402  (registers the `specdec` ops)

__all__ = ["_C", "_build_meta"]
