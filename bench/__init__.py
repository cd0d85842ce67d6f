"""The repository's benches and the end-to-end harness (the demo included); not part of the wheel.

Run from a checkout: ``python -m specdec_cuda demo`` / ``bench`` (which import this package), or a
script directly (``python bench/bench_tree.py``)."""
