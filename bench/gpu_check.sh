#!/usr/bin/env bash
# The one script to run on a GPU machine (target: under 8 minutes on an H200 with 16 cores).
#
#   bench/gpu_check.sh OUT_DIR [PYTHON]
#
# Builds the extension in place for sm_90 with every core, measures the HBM bandwidth (a 2 GiB
# device-to-device copy), runs the test suite (-m "not slow": the CUDA tests run since a GPU is
# present) and each family's benchmarks, writing JSON results and gpu_check.log into OUT_DIR.
# PYTHON: an interpreter with torch (CUDA build) installed; default $PYTHON, ./.venv/bin/python, or
# python3. With GPU_CHECK_VENV=1 a virtualenv is created in OUT_DIR/venv on top of it
# (--system-site-packages, so torch is reused; nothing is downloaded).
#
# Families add their tests / benchmarks in their own section below (copy the sampling block).
# Step limits add up to about 27 minutes in the worst case (steps usually end far sooner; a device
# call may last 10 minutes, so split a run that could pass that): with
# GPU_CHECK_ONLY=tests,bench_quant (a comma-separated list of step names) only those steps run
# after the build and the HBM measurement. The compute-sanitizer steps (sanitize_memcheck,
# sanitize_racecheck, up to 9 more minutes) run only with GPU_CHECK_SANITIZE=1 or when named there.
set -u
OUT=${1:?usage: bench/gpu_check.sh OUT_DIR [PYTHON]}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${2:-${PYTHON:-}}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ "${GPU_CHECK_VENV:-0}" = 1 ]; then
  "$PY" -m venv --system-site-packages "$OUT/venv" && PY="$OUT/venv/bin/python"
fi
LOG="$OUT/gpu_check.log"
: > "$LOG"
FAILED=()
START=$(date +%s)

log() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$LOG"; }

# step NAME TIMEOUT_S CMD...: run with a time limit, log output and result, keep going on failure.
step() {
  local name=$1 limit=$2
  shift 2
  if [ -n "${GPU_CHECK_ONLY:-}" ] && [ "$name" != build ] && [[ ",$GPU_CHECK_ONLY," != *",$name,"* ]]; then
    log "---- $name: skipped (not in GPU_CHECK_ONLY=$GPU_CHECK_ONLY)"
    return 0
  fi
  log "---- $name (limit ${limit}s): $*"
  local t0=$(date +%s)
  timeout "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  log "---- $name: rc=$rc in $(( $(date +%s) - t0 ))s"
  [ $rc -eq 0 ] || FAILED+=("$name")
  return $rc
}

log "repo $(pwd), python $PY, out $OUT"
nvidia-smi >> "$LOG" 2>&1
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())" 2>&1 | tee -a "$LOG"

# ---- build: sm_90, all cores ---------------------------------------------------------------------
export TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=$(nproc) SPECDEC_CUDA=1
step build 240 "$PY" setup.py build_ext --inplace || { log "build failed: see $LOG"; exit 1; }
"$PY" -c "import sys; sys.path.insert(0, 'python'); import specdec_cuda; print(specdec_cuda.build_info())" 2>&1 | tee -a "$LOG"

# ---- HBM bandwidth: 2 GiB device-to-device copy (read + write) ----------------------------------
HBM=$("$PY" - <<'PYEOF' 2>>"$LOG"
import torch
n = 2**31
src = torch.empty(n, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
for _ in range(3): dst.copy_(src)
torch.cuda.synchronize()
times = []
for _ in range(10):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); dst.copy_(src); b.record(); b.synchronize(); times.append(a.elapsed_time(b))
times.sort()
print(f"{2 * n / (times[len(times) // 2] * 1e-3) / 1e9:.1f}")
PYEOF
)
log "HBM bandwidth: ${HBM:-unknown} GB/s"
echo "{\"hbm_gbps\": ${HBM:-null}}" > "$OUT/hbm.json"
HBM_ARG=()
[ -n "${HBM:-}" ] && HBM_ARG=(--hbm-gbps "$HBM")

# ---- tests (all families): the fast suite, CUDA tests included ----------------------------------
# pytest-xdist, when installed, runs the suite in 8 worker processes so that a test which crashes
# the process (see diagnose_error_path below) fails alone instead of ending the run.
XDIST=()
"$PY" -c "import xdist" 2>/dev/null && XDIST=(-n 8)
step tests 150 "$PY" -m pytest -q -m "not slow" tests/ -p no:cacheprovider "${XDIST[@]}"
# Does a C++ TORCH_CHECK failure raise or crash here? If it crashes: toolchain facts and a relink test.
step diagnose_error_path 60 bash bench/diagnose_error_path.sh "$OUT" "$PY"

# ==== family: sampling ===========================================================================
step bench_sampling 90 "$PY" bench/bench_sampling.py --device cuda --out "$OUT/sampling.json" "${HBM_ARG[@]}"
# ==== end family: sampling =======================================================================

# ==== family: models ==============================================================================
step bench_models 45 "$PY" bench/bench_models.py --device cuda --quick --out "$OUT/models.json"
# end to end needs the trained zoo pair: training it here would eat the time budget, so
# carry .cache/zoo from the development machine (the device tool's `carry`) unless the v4 pair is
# shipped in zoo/; without either, skipped.
if [ -d zoo/pycode-v4 ] || [ -d .cache/zoo/pystdlib-v3 ]; then
  step bench_e2e 150 "$PY" bench/bench_e2e.py --device cuda --quick --repeats 1 --out "$OUT/e2e.json"
else
  log "bench_e2e skipped: no trained zoo pair in .cache/zoo (carry it)"
fi
# ==== end family: models ==========================================================================

# ==== family: tree ================================================================================
# budgets 16 and 64, B 1 and 8, three modes; the JSON flags the B = 8 / 64-node H200 target (< 100 us)
step bench_tree 75 "$PY" bench/bench_tree.py --device cuda --quick --out "$OUT/tree.json" "${HBM_ARG[@]}"
# ==== end family: tree ============================================================================

# ==== family: ngram / lookahead ===================================================================
# Index lookup at up to 32k tokens vs the Python reference; with the zoo pair (carried in .cache/zoo)
# also batch-1 greedy end to end: AR, transformers prompt lookup, draft, prompt_lookup, lookahead,
# lookahead+draft on the repetitive and general workloads, the issue's targets flagged met / NOT met.
if [ -d .cache/zoo/pystdlib-v3 ]; then
  step bench_ngram 150 "$PY" bench/bench_ngram.py --device cuda --quick --no-sweeps --out "$OUT/ngram.json"
else
  step bench_ngram 60 "$PY" bench/bench_ngram.py --part index --quick --out "$OUT/ngram.json"
fi
# ==== end family: ngram / lookahead ===============================================================

# ==== family: ddtree ==============================================================================
# The tree-building op at B = 8, M = 256 (target < 50 us on an H200) always; with the zoo pair and
# its DFlash drafter (carry .cache/zoo), tau / speedup against M and block size too.
if [ -d .cache/zoo/pystdlib-v3/dflash ]; then
  step bench_ddtree 150 "$PY" bench/bench_ddtree.py --device cuda --quick --out "$OUT/ddtree.json"
else
  step bench_ddtree 30 "$PY" bench/bench_ddtree.py --device cuda --op-only --out "$OUT/ddtree.json"
fi
# ==== end family: ddtree ==========================================================================

# ==== family: quant ===============================================================================
# The quant CUDA tests (tests/test_quant*.py: tensor-core W4A16 vs the reference, M 1..128, real
# layer shapes) run in the `tests` step above. The bench flags the issue's H200 targets at M = 1,
# 8192 x 8192 (>= 70 % of HBM, >= 2.5x bf16 cuBLAS) as meets_target in quant.json, on GPU time
# (host dispatch excluded; eager latency reported beside it). --tune also times every launch
# configuration of the kernel and prints the fastest correct one per case ("best for ...").
step bench_quant 150 "$PY" bench/bench_quant.py --device cuda --quick --tune --out "$OUT/quant.json" "${HBM_ARG[@]}"
# ==== end family: quant ===========================================================================

# ==== family: kv_quant ============================================================================
step bench_kv_quant 30 "$PY" bench/bench_kv_quant.py --device cuda --out "$OUT/kv_quant.json"
# ==== end family: kv_quant ========================================================================

# ==== family: mtp ===============================================================================
# Fused MTP-head op (norm + LM head + top-k) against the unfused torch sequence, zoo and Llama-3-8B
# shapes; the issue's H200 target is >= 70% of HBM bandwidth for the LM-head read (lm_head_GBps).
step bench_mtp 90 "$PY" bench/bench_mtp.py --device cuda --quick --part kernel --out "$OUT/mtp.json"
# ==== end family: mtp =============================================================================

# ==== family: quantspec ===========================================================================
# The quant_kv_attention CUDA tests (CUDA equals CPU) run in the `tests` step above. Here: the
# kernel against dequantise + SDPA at 4k context, and speed on the GPU-shaped model (bf16) at 4k,
# quantspec against autoregressive decoding (--quick: 2 layers; acceptance on the zoo target only
# when .cache/zoo is carried).
step bench_quantspec 150 "$PY" bench/bench_quantspec.py --device cuda --quick --parts kernel,kv_bytes,speed --out "$OUT/quantspec.json"
# ==== end family: quantspec =======================================================================

# ==== family: gguf / real models ==================================================================
# The real bench's models cannot travel to the device; its kernels can. gguf_matmul's CUDA kernel on
# Qwen2.5-Coder-1.5B's shapes (Q4_K attention / MLP, every format at 8960 x 1536, the Q6_K LM head;
# M = 1, 5, 16, 64), each checked against x · dequant(W)ᵀ first, timed against dequant+mm, fp32 mm
# and bf16 cuBLAS, weight GB/s as % of HBM (gguf_cuda.json). The verification kernels at its
# vocabulary (151,936) are in bench_sampling above.
step bench_gguf 120 "$PY" bench/bench_gguf.py --device cuda --out "$OUT/gguf_cuda.json"
# ==== end family: gguf / real models ==============================================================

# ==== hardening: compute-sanitizer ==========================================================
# memcheck (out-of-bounds / misaligned device accesses, leaks of device errors) and racecheck
# (shared-memory hazards) over the CUDA tests: every test whose name or file says cuda, plus the
# fuzz suite's CUDA cases. Slow (the tools instrument every kernel): they run only with
# GPU_CHECK_SANITIZE=1 or when named in GPU_CHECK_ONLY (GPU_CHECK_ONLY=sanitize_memcheck,
# sanitize_racecheck runs just them after the build). Each writes its "ERROR SUMMARY" line to the
# log and hence to summary.txt; a reported error fails the step (--error-exitcode).
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ "${GPU_CHECK_SANITIZE:-0}" = 1 ] || [[ ",${GPU_CHECK_ONLY:-}," == *",sanitize_"* ]]; then
  if [ -z "$SANITIZER" ]; then
    log "sanitize: compute-sanitizer not found; skipped"
  else
    SAN_TESTS=(-m "not slow" -k cuda tests/ -p no:cacheprovider -x -q)
    step sanitize_memcheck 300 "$SANITIZER" --tool memcheck --error-exitcode 99 --target-processes all \
      "$PY" -m pytest "${SAN_TESTS[@]}"
    step sanitize_racecheck 240 "$SANITIZER" --tool racecheck --racecheck-report hazard --error-exitcode 99 \
      --target-processes all "$PY" -m pytest "${SAN_TESTS[@]}"
  fi
fi
# ==== end hardening ===============================================================================

log "done in $(( $(date +%s) - START ))s; failed steps: ${FAILED[*]:-none}"
# The lines worth reading first, in one short file: step results, test counts, the error-path probes,
# HBM bandwidth, targets and the tuning sweep's winners.
grep -E "^\[gpu_check .*(----.*rc=|HBM bandwidth|done in|sanitize)|passed|failed|probe|target|best for|gpu total|ERROR SUMMARY" "$LOG" \
  > "$OUT/summary.txt" 2>/dev/null
[ ${#FAILED[@]} -eq 0 ]
