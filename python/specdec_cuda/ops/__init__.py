"""The kernels' Python face: one module per op family, all re-exported here."""

from __future__ import annotations
