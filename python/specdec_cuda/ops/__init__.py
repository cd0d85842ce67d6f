"""The kernels' Python face: one module per op family, all re-exported here."""

from __future__ import annotations

from .sampling import *  # noqa: E402,F401,F403  (sample, verify_chain, Purpose, raise_on_status, ...)
from .sampling import __all__ as _sampling_all  # noqa: E402

__all__ = [*_sampling_all]
