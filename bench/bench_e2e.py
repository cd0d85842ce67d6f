"""End-to-end benchmark: this engine (autoregressive, draft-model speculative) vs transformers
generate (plain and with assistant_model=) on the zoo pair, batch 1 and batch 8.

Usage: python bench/bench_e2e.py [--quick] [--out PATH] [--target DIR --draft DIR] [--k K]
Writes JSON (default bench/results/e2e.json) and prints a table and the ratios.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from specdec_cuda.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
