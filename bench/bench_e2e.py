"""End-to-end benchmark: this engine (autoregressive decoding and every registered method, in the
configurations ``bench/configs.py`` lists) against transformers ``generate``
(plain, ``assistant_model=`` the zoo draft, ``prompt_lookup_num_tokens=``), on the built-in
prompts and the pair's held-out prompts, batch 1 and 8, greedy and T = 0.8, in one table.

Usage: python bench/bench_e2e.py [--quick] [--out PATH] [--target DIR --draft DIR] [--zoo NAME]
                                 [--prompts N] [--batch B] [--max-new-tokens N] [--repeats R]
Writes JSON (default bench/results/e2e.json): every row, the best engine / best transformers
ratio per setting and the headline (held-out, batch 1, greedy; target >= 1.5x).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from specdec_cuda.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
