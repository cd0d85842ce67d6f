#!/usr/bin/env bash
# Does a C++ TORCH_CHECK failure in this build raise a Python error, or crash the process?
#
#   bench/diagnose_error_path.sh OUT_DIR PYTHON
#
# On the first H200 image (Ubuntu Python 3.12, torch 2.11, link line
# `x86_64-linux-gnu-gcc -shared -Wl,-Bsymbolic-functions`) every TORCH_CHECK failure of _C.so
# crashed while the message was formatted (std::ostream::_M_insert<long> and codecvt::do_unshift
# resolved inside _C.so); CI's environment raises as it should. This script runs one failing op in a
# child process. When that crashes it tries a check whose message needs no formatting, collects what
# decides the cause (the toolchain and link line, which objects define libstdc++ locale / ostream
# symbols, which libstdc++ the process loads) and tests whether relinking the same objects with g++
# (no -Bsymbolic-functions) fixes it. Writes OUT_DIR/error_path.log; exits 0 when errors raise.
set -u
OUT=${1:?usage: bench/diagnose_error_path.sh OUT_DIR PYTHON}
PY=${2:?usage: bench/diagnose_error_path.sh OUT_DIR PYTHON}
cd "$(dirname "$0")/.."
LOG="$OUT/error_path.log"
: > "$LOG"

# probe PYTHONPATH_DIR: rc 0 = RuntimeError raised with the message, other = crash or wrong error
probe() {
  PYTHONPATH="$1" "$PY" - <<'PYEOF' >> "$LOG" 2>&1
import torch
import specdec_cuda
from specdec_cuda.ops import quant as q
pw = q.quantize_w4(torch.randn(8, 96), 32)
try:
    torch.ops.specdec.w4a16_matmul(torch.randn(2, 96), pw.packed, pw.scales, 32, 1, torch.empty(2, 8))
except RuntimeError as e:
    print("raised as expected:", str(e).splitlines()[0])
    raise SystemExit(0)
raise SystemExit("no error raised")
PYEOF
}

probe python
RC=$?
echo "probe with the built _C.so: rc=$RC" | tee -a "$LOG"
[ $RC -eq 0 ] && exit 0

# A check whose message is one string literal: TORCH_CHECK then formats nothing in _C.so (c10::str
# of a single argument returns it as is; several arguments go through an ostringstream inlined into
# _C.so). Raising here while the probe above crashed puts the fault in that inlined formatting.
PYTHONPATH=python "$PY" - <<'PYEOF' >> "$LOG" 2>&1
import torch
import specdec_cuda
from specdec_cuda.ops import quant as q
pw = q.quantize_w4(torch.randn(32, 96), 32)
packed = pw.packed.transpose(0, 1).contiguous().transpose(0, 1)  # same shape, not contiguous
try:
    torch.ops.specdec.w4a16_matmul(torch.randn(2, 96), packed, pw.scales, 32, 0, torch.empty(2, 32))
except RuntimeError as e:
    print("literal-only message raised as expected:", str(e).splitlines()[0])
    raise SystemExit(0)
raise SystemExit("no error raised")
PYEOF
echo "probe with a literal-only message: rc=$?" | tee -a "$LOG"

SO=$(ls python/specdec_cuda/_C*.so)
TAG=$("$PY" -c "import sys; print(f'cpython-{sys.version_info[0]}{sys.version_info[1]}')")
OBJDIR=$(ls -d build/temp.*-"$TAG" | head -1)  # this interpreter's build only
{
  echo "---- toolchain"
  "$PY" -c "import sysconfig as s; print('LDSHARED', s.get_config_var('LDSHARED')); print('CXX', s.get_config_var('CXX'))"
  c++ --version | head -1; gcc --version | head -1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cxx11 abi', torch._C._GLIBCXX_USE_CXX11_ABI)"
  echo "---- libstdc++ / libgcc mapped in a process that imported torch"
  "$PY" -c "import torch; print(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libstdc++' in l or 'libgcc_s' in l}))"
  echo "---- NEEDED of $SO"
  readelf -d "$SO" | grep NEEDED
  echo "---- libstdc++ locale / ostream symbols defined in $SO (first 30)"
  nm -C --defined-only "$SO" | grep -E "codecvt|std::locale|_M_insert<|num_put|basic_ostream|__format" | head -30
  echo "---- objects defining such symbols (count, object)"
  for o in $(find "$OBJDIR" -name '*.o'); do
    c=$(nm -C --defined-only "$o" 2>/dev/null | grep -cE "codecvt|std::locale|_M_insert<|num_put|__format")
    [ "$c" -gt 0 ] && echo "$c $o"
  done | sort -rn | head -20
} >> "$LOG" 2>&1

# Relink the same objects with the C++ driver and without -Bsymbolic-functions, and probe again.
TMP=$(mktemp -d)
cp -r python "$TMP/"
TORCH_LIB=$("$PY" -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'lib'))")
CUDA_LIB=${CUDA_HOME:-/usr/local/cuda}/lib64
OBJS=$(find "$OBJDIR" -name '*.o' | sort)
if g++ -shared -o "$TMP/python/specdec_cuda/$(basename "$SO")" $OBJS -L"$TORCH_LIB" -L"$CUDA_LIB" \
    -lc10 -ltorch -ltorch_cpu -ltorch_python -lcudart -lc10_cuda -ltorch_cuda -fopenmp >> "$LOG" 2>&1; then
  probe "$TMP/python"
  echo "probe after relinking with g++ (no -Bsymbolic-functions): rc=$?" | tee -a "$LOG"
else
  echo "relink with g++ failed (see above)" | tee -a "$LOG"
fi
rm -rf "$TMP"
exit 1
