"""The project's own demo models: a corpus, training scripts and the shipped pair; not part of the wheel.

Modules: ``pairs`` (the stdlib corpus, the v3 pair, caching and shipping), ``v4`` (the long,
resumable v4 run), ``unlikelihood`` (its fine-tune against greedy loops), ``heads`` (Medusa heads and
MTP modules), ``dflash`` (the DFlash drafter), ``diffusion`` (the masked-diffusion LM). The command
line is ``python -m zoo.train``. The shipped models sit beside them (``zoo/pycode-v4``,
``zoo/pycode-v4-diffusion-ar``); to the library they are ordinary checkpoint folders.
"""
