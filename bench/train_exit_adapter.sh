#!/usr/bin/env bash
# Train the exit adapter of method="layer_skip" (Kangaroo) for the real GGUF target,
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M, on CPU: the target reads windows of the Python standard
# library (never HumanEval) and its own next-token distributions are the labels. Writes the drafter
# cache, where `bench/bench_real.py --weights gguf --methods layer_skip` finds it.
# Resumable: run it again after an interruption (data shards and checkpoints are kept).
#
#   bash bench/train_exit_adapter.sh     # WINDOWS=800 TOKENS=512 STEPS=400 EXIT_LAYER=8 by default
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WINDOWS=${WINDOWS:-800}
TOKENS=${TOKENS:-512}
STEPS=${STEPS:-400}
EXIT_LAYER=${EXIT_LAYER:-8}
THREADS=${THREADS:-2}
TARGET=$($PY -m specdec_cuda models path qwen2.5-coder-1.5b | tail -n 1)
mkdir -p bench/results
$PY bench/stdlib_texts.py --out bench/results/stdlib-texts
$PY -m specdec_cuda.train exit --target "$TARGET" --weights gguf --data bench/results/stdlib-texts --glob '*.py' \
    --num-prompts "$WINDOWS" --prompt-tokens "$TOKENS" --gen-batch 4 --batch-size 8 --steps "$STEPS" --lr 1e-3 \
    --exit-layer "$EXIT_LAYER" --autocast --threads "$THREADS"
