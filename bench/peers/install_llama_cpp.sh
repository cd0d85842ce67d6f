#!/usr/bin/env bash
# A private llama.cpp (through llama-cpp-python) for the peer rows of the real bench.
#
# It lives in its own virtual environment, .venv-llamacpp, never in the project's .venv: the peer
# runner (bench/peers/llama_cpp_peer.py) runs there as a subprocess and imports neither torch nor
# specdec_cuda. llama-cpp-python is built from the registry's pinned source package with its own
# CMake, as a native CPU build, so the figures are llama.cpp at its best on this machine.
# The build takes several minutes on 2 cores; it is skipped when the venv already has the version.
#
#   bash bench/peers/install_llama_cpp.sh [VENV]        (make llama-cpp-env)
# Environment: PYTHON (the interpreter that makes the venv, default python3),
#              LLAMA_CPP_CMAKE_ARGS (extra CMake switches, appended to the native build's).
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION=0.3.36
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-$ROOT/.venv-llamacpp}"
PYTHON="${PYTHON:-python3}"
PY="$VENV/bin/python"

# Refuse the project's own environment (or the interpreter pip would otherwise use): this package
# must only ever land in its private venv.
case "$(cd "$(dirname "$VENV")" 2>/dev/null && pwd)/$(basename "$VENV")" in
    "$ROOT/.venv") echo "install_llama_cpp.sh: refusing to install into the project's .venv" >&2; exit 2;;
esac

if [ -x "$PY" ]; then
    have="$("$PY" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)"
    if [ "$have" = "$LLAMA_CPP_PYTHON_VERSION" ]; then
        echo "llama-cpp-python $have already in $VENV"
        exit 0
    fi
fi

if [ ! -x "$PY" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# Inside the venv, sys.prefix must be the venv's: a broken venv must not fall through to a global pip.
"$PY" -c 'import sys; assert sys.prefix != sys.base_prefix, "not a virtual environment"'

# GGML_NATIVE: compile for this CPU's instruction set (AVX2/AVX-512 as present), as a user of
# llama.cpp on this machine would. No GPU backends: the peer is the CPU engine.
export CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF ${LLAMA_CPP_CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"

echo "building llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION into $VENV (CMAKE_ARGS=$CMAKE_ARGS); several minutes"
# --no-binary: the source package, built here with its own CMake (no prebuilt wheel).
nice -n 10 "$PY" -m pip install --no-cache-dir --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
"$PY" -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__, "ready")'
