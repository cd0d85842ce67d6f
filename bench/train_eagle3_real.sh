#!/usr/bin/env bash
# Train an EAGLE-3 drafter for the real GGUF target, Qwen2.5-Coder-1.5B-Instruct Q4_K_M, on CPU:
# the target reads windows of the Python standard library (never HumanEval; teacher forcing, one
# forward per window) and its own next-token distributions are the labels. Writes the drafter
# cache, where `bench/bench_real.py --weights gguf --methods eagle3` finds it.
# Resumable: run it again after an interruption (data shards and checkpoints are kept).
#
#   bash bench/train_eagle3_real.sh   # WINDOWS=640 TOKENS=512 STEPS=300 TTT=3 VOCAB=16384 MLP=2048
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
WINDOWS=${WINDOWS:-640}
TOKENS=${TOKENS:-512}
STEPS=${STEPS:-300}
TTT=${TTT:-3}
VOCAB=${VOCAB:-16384}
MLP=${MLP:-2048}
BATCH=${BATCH:-8}
LR=${LR:-1e-3}
THREADS=${THREADS:-2}
TARGET=$($PY -m specdec_cuda models path qwen2.5-coder-1.5b | tail -n 1)
mkdir -p bench/results
$PY bench/stdlib_texts.py --out bench/results/stdlib-texts
$PY -m specdec_cuda.train eagle3 --target "$TARGET" --weights gguf --data bench/results/stdlib-texts --glob '*.py' \
    --num-prompts "$WINDOWS" --prompt-tokens "$TOKENS" --gen-tokens 0 --gen-batch 4 --batch-size "$BATCH" \
    --steps "$STEPS" --lr "$LR" --ttt-steps "$TTT" --draft-vocab "$VOCAB" --eagle3-mlp "$MLP" --autocast \
    --threads "$THREADS"
