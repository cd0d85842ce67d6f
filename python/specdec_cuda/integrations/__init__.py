"""Engines that host the project's pieces: one module per engine, each importing only the ops.

``specdec_cuda.integrations.sglang`` offers stand-ins for the ``sgl_kernel`` calls of SGLang's
EAGLE tree verification (same names, arguments and in-place outputs) computed by the project's
``build_tree`` / ``verify_tree``, on CPU as well as CUDA. Nothing here is imported by the rest of
the package, and no module here imports the engine it serves.
"""
