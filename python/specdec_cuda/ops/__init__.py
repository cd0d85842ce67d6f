"""The kernels' Python face: one module per op family, all re-exported here."""

from __future__ import annotations

from .tree import build_tree, compact_kv, verify_tree  # noqa: F401
