#!/usr/bin/env bash
# Proves that a CPU-only build (SPECDEC_CUDA=0) builds and passes the kernel tests (the modules
# marked `kernels`: every op against its reference, the build's facts, the fuzz and hardening
# suites), in a scratch copy so the main tree's CUDA build is left alone. The rest of the suite
# runs the same Python over the same CPU kernels, which `make test` has just run on the full build;
# running all of it again here cost CI ~10 minutes for nothing the kernel tests do not cover.
# Usage: scripts/cpu_only_check.sh [python]
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
echo "[cpu-only-check] running the kernel tests against the CPU-only build"
"$PY" -m pytest -q -m "kernels and not slow" tests
