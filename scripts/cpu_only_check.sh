#!/usr/bin/env bash
# Proves that a CPU-only build (SPECDEC_CUDA=0) builds and passes the fast CPU tests, in a scratch
# copy so the main tree's CUDA build is left alone. Usage: scripts/cpu_only_check.sh [python]
set -euo pipefail
PY="${1:-python3}"
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
cp -r "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT/csrc" "$ROOT/python" "$ROOT/tests" "$ROOT/bench" "$ROOT/zoo" "$SCRATCH/"
rm -f "$SCRATCH"/python/specdec_cuda/_C*.so "$SCRATCH"/python/specdec_cuda/_build_meta.py
cd "$SCRATCH"
echo "[cpu-only-check] building with SPECDEC_CUDA=0 in $SCRATCH"
SPECDEC_CUDA=0 "$PY" setup.py -q build_ext --inplace
PYTHONPATH=python "$PY" - <<'PYEOF'
import specdec_cuda
info = specdec_cuda.build_info()
assert info["with_cuda"] is False, info
print("[cpu-only-check] build_info:", info)
PYEOF
echo "[cpu-only-check] running the fast CPU tests against the CPU-only build"
"$PY" -m pytest -q -m "not slow" tests
