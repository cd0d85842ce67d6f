"""The kernels' Python face: one module per op family, all re-exported here."""

from __future__ import annotations

from . import kv_quant  # noqa: F401
from . import quant  # noqa: F401
