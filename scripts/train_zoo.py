"""Train (once) and cache the zoo pair used by the demo and the end-to-end benchmark.

Usage: python scripts/train_zoo.py [--force] [--zoo v4 [--run-dir DIR] --threads 1]   (same as `python -m specdec_cuda zoo`)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))

from specdec_cuda.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["zoo", *sys.argv[1:]]))
