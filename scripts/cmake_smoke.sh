#!/usr/bin/env bash
# Proves that CMakeLists.txt (the build for C++ engines that link libtorch without Python) builds,
# links and registers the ops: a CPU-only CMake build of libspecdec_ops.so in a scratch folder,
# loaded with torch.ops.load_library (no pybind11 module, no `import specdec_cuda`) and one op
# called. CPU only on purpose: the CUDA sources are already compiled and linked by CI's setup.py
# build, and nvcc would double the cost. Usage: scripts/cmake_smoke.sh [python]
set -euo pipefail
PY="${1:-python3}"
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="$(mktemp -d)"
trap 'rm -rf "$BUILD"' EXIT
# cmake >= 3.25 (CMakeLists.txt); ninja comes with the dev requirements, next to the interpreter
CMAKE="$(command -v cmake || true)"
[ -x "$(dirname "$PY")/cmake" ] && CMAKE="$(dirname "$PY")/cmake"
if [ -z "$CMAKE" ]; then
  echo "[cmake-smoke] no cmake found: install cmake >= 3.25 (apt install cmake, or pip install cmake)" >&2
  exit 1
fi
GENERATOR=()
[ -x "$(dirname "$PY")/ninja" ] && GENERATOR=(-G Ninja -DCMAKE_MAKE_PROGRAM="$(dirname "$PY")/ninja")
PREFIX="$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')"
# A CUDA build of torch makes find_package(Torch) look for the CUDA toolkit even for CPU kernels;
# point it where torch.utils.cpp_extension looks (CUDA_HOME, else /usr/local/cuda), since CMake
# guesses the root from the nvcc on PATH, which may be a wrapper outside the toolkit.
# With no TORCH_CUDA_ARCH_LIST it would also try to run a probe on a GPU; name the archs instead.
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-8.0;9.0}"
CUDA_ROOT="${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}"
CUDA_HINTS=()
[ -d "$CUDA_ROOT" ] && CUDA_HINTS=(-DCUDA_TOOLKIT_ROOT_DIR="$CUDA_ROOT" -DCUDAToolkit_ROOT="$CUDA_ROOT")
start=$(date +%s)
# No build type (no -O, no -g): the smoke test proves building, linking and registering, and an
# unoptimised compile is the cheapest (the kernels' speed is setup.py's build's business).
"$CMAKE" -S "$ROOT" -B "$BUILD" "${GENERATOR[@]}" "${CUDA_HINTS[@]}" -DSPECDEC_CUDA=OFF \
  -DCMAKE_BUILD_TYPE= -DCMAKE_PREFIX_PATH="$PREFIX" > "$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log"; exit 1; }
"$CMAKE" --build "$BUILD" -j "${MAX_JOBS:-2}"
echo "[cmake-smoke] built $(ls "$BUILD"/libspecdec_ops.so) in $(( $(date +%s) - start ))s"
"$PY" - "$BUILD/libspecdec_ops.so" <<'PYEOF'
import sys

import torch

torch.ops.load_library(sys.argv[1])
# sample, greedy rows: the argmax of each row, status 0 (specdec_cuda.ops.status.STATUS_OK)
logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, -1.0, 5.0], [float("nan"), 0.0, 0.0]])
rows = logits.shape[0]
tokens = torch.empty(rows, dtype=torch.int64)
status = torch.empty(rows, dtype=torch.int32)
torch.ops.specdec.sample(logits, torch.zeros(rows), torch.zeros(rows, dtype=torch.int32),
                         torch.ones(rows), torch.zeros(rows, dtype=torch.int64),
                         torch.zeros(rows, dtype=torch.int64), 3, 0, tokens, status)
assert tokens.tolist() == [1, 2, -1], tokens
assert status.tolist() == [0, 0, 1], status  # row 2: non-finite logits
print("[cmake-smoke] torch.ops.load_library + specdec::sample ok")
PYEOF
