"""Other engines benched beside this one on the same files and prompts (see docs/benchmarks.md).

Each peer runs in its own environment as a subprocess; the modules here that the bench imports
only build its job, run it and turn its result into bench rows.
"""
