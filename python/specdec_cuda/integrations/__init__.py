"""Engines that host the project's pieces: one module per engine, each importing only the ops.

``specdec_cuda.integrations.sglang`` offers stand-ins for the ``sgl_kernel`` calls of SGLang's
EAGLE tree verification (same names, arguments and in-place outputs) computed by the project's
``build_tree`` / ``verify_tree``, on CPU as well as CUDA. ``specdec_cuda.integrations.vllm`` is a
vLLM plugin (entry point group ``vllm.general_plugins``): ``verify_chain`` as vLLM V1's rejection
sampler, and the project's n-gram index as a ``custom_class`` proposer. Nothing here is imported by
the rest of the package; the vLLM module imports vLLM only inside the function that installs it.
"""
