#!/usr/bin/env bash
# A private llama.cpp (through llama-cpp-python) for the peer rows of the real bench.
#
# It lives in its own virtual environment, .venv-llamacpp, never in the project's .venv: the peer
# runner (bench/peers/llama_cpp_peer.py) runs there as a subprocess and imports neither torch nor
# specdec_cuda. llama-cpp-python is built from the registry's pinned source package with its own
# CMake, as a native CPU build (on AMX CPUs without AMX: below), so the figures are llama.cpp at
# its best on this machine. The build takes several minutes on 2 cores; it is skipped when the venv
# already has the version, built the same way.
#
#   bash bench/peers/install_llama_cpp.sh [VENV]        (make llama-cpp-env)
# Environment: PYTHON (the interpreter that makes the venv, default python3),
#              LLAMA_CPP_CMAKE_ARGS (extra CMake switches, appended to the native build's),
#              LLAMA_CPP_AMX=1 (keep AMX in the build on an AMX CPU).
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

# GGML_NATIVE: compile for this CPU's instruction set (AVX2/AVX-512 as present), as a user of
# llama.cpp on this machine would. No GPU backends: the peer is the CPU engine.
#
# Except AMX: with -march=native on an AMX CPU, llama.cpp repacks Q4_K_M weights into its AMX buffer
# and dies of SIGSEGV at the first decode (ggml-org/llama.cpp#20824, open; seen on this project's
# Sapphire Rapids-class VMs), and the only switch left at run time, use_extra_bufts = False, also
# drops its AVX2 / AVX-512 weight repacking (CPU_REPACK). So on an AMX CPU the build names this CPU's
# other extensions one by one and leaves AMX out: llama.cpp's fastest path that runs here.
# LLAMA_CPP_AMX=1 keeps the native build.
flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
has() { case " $flags " in *" $1 "*) return 0;; *) return 1;; esac; }
ISA_ARGS="-DGGML_NATIVE=ON"
FLAVOUR=native
if has amx_int8 && [ "${LLAMA_CPP_AMX:-0}" != "1" ]; then
    FLAVOUR=native-without-amx
    ISA_ARGS="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    ISA_ARGS="$ISA_ARGS -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    has avx512f && has avx512bw && has avx512vl && has avx512dq && ISA_ARGS="$ISA_ARGS -DGGML_AVX512=ON"
    has avx512vbmi && ISA_ARGS="$ISA_ARGS -DGGML_AVX512_VBMI=ON"
    has avx512_vnni && ISA_ARGS="$ISA_ARGS -DGGML_AVX512_VNNI=ON"
    has avx512_bf16 && ISA_ARGS="$ISA_ARGS -DGGML_AVX512_BF16=ON"
    has avx_vnni && ISA_ARGS="$ISA_ARGS -DGGML_AVX_VNNI=ON"
fi

if [ -x "$PY" ]; then
    have="$("$PY" -c 'import importlib.metadata as m; print(m.version("llama_cpp_python"))' 2>/dev/null || true)"
    built="$(cat "$VENV/.llama-cpp-flavour" 2>/dev/null || echo native)"
    if [ "$have" = "$LLAMA_CPP_PYTHON_VERSION" ] && [ "$built" = "$FLAVOUR" ]; then
        echo "llama-cpp-python $have ($FLAVOUR build) already in $VENV"
        exit 0
    fi
fi

if [ ! -x "$PY" ]; then
    "$PYTHON" -m venv "$VENV"
fi
# Inside the venv, sys.prefix must be the venv's: a broken venv must not fall through to a global pip.
"$PY" -c 'import sys; assert sys.prefix != sys.base_prefix, "not a virtual environment"'

export CMAKE_ARGS="$ISA_ARGS -DGGML_CUDA=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF ${LLAMA_CPP_CMAKE_ARGS:-}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"

echo "building llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION into $VENV (CMAKE_ARGS=$CMAKE_ARGS); several minutes"
# --no-binary: the source package, built here with its own CMake (no prebuilt wheel).
nice -n 10 "$PY" -m pip install --no-cache-dir --no-binary llama-cpp-python --force-reinstall --no-deps \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION"
"$PY" -m pip install --no-cache-dir "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >/dev/null  # its dependencies
echo "$FLAVOUR" > "$VENV/.llama-cpp-flavour"
"$PY" -c 'import llama_cpp; print("llama-cpp-python", llama_cpp.__version__, "ready")'
