#!/usr/bin/env bash
# Train the real pair's drafters (Medusa heads, MTP modules, an EAGLE-3 drafter) for
# Qwen2.5-Coder-1.5B-Instruct on CPU, from standard-library prompts (never HumanEval), into the
# drafter cache, where bench/bench_real.py's medusa / mtp / eagle3 rows find them.
# Resumable: run it again after an interruption (the data shards and the checkpoints are kept).
#
#   bash bench/train_real_drafters.sh            # PROMPTS=240 GEN=128 STEPS=300 by default
#
# The target runs through torch's bf16 matmuls for the data (SPECDEC_PACKED_LINEAR=0: AMX where
# the CPU has it) and the drafters train under bf16 autocast; the features cache is shared.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
PROMPTS=${PROMPTS:-240}
GEN=${GEN:-128}
STEPS=${STEPS:-300}
THREADS=${THREADS:-2}
TARGET=$($PY -m specdec_cuda models path qwen2.5-coder-1.5b | tail -n 1)
mkdir -p bench/results
$PY bench/stdlib_prompts.py --out bench/results/stdlib-prompts.jsonl --count "$PROMPTS"
common=(--target "$TARGET" --prompts bench/results/stdlib-prompts.jsonl --gen-tokens "$GEN" --gen-batch 16
        --dtype bfloat16 --autocast --threads "$THREADS" --batch-size 8)
export SPECDEC_PACKED_LINEAR=0
$PY -m specdec_cuda.train medusa "${common[@]}" --steps "$STEPS"
$PY -m specdec_cuda.train mtp "${common[@]}" --steps "$STEPS"
$PY -m specdec_cuda.train eagle3 "${common[@]}" --steps "$STEPS" --ttt-steps 4 --draft-vocab 8192
