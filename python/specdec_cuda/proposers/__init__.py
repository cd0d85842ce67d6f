"""One module per decoding method: the only place methods differ.

Each method module registers itself in ``specdec_cuda.methods`` on import; the registry imports
the built-in ones (``methods.BUILTIN_MODULES``) the first time it is asked.
"""
