"""Keep a long CPU training run's memory flat under glibc's allocator.

A drafter's training batch is a different shape every step (sequences of different lengths, a
different number of kept labels), and its largest tensors (the [B, T, V] logits of each
training-time-test step, the MLP activations kept for backward) are tens of MB each. glibc serves
a block that size from ``mmap`` at first, but it raises its mmap threshold to the size of every
mmapped block freed (up to 32 MB), so from then on such blocks come from the heap arenas, where
blocks of ever-changing sizes fragment them and freed memory is not returned. On the real 1.5B
target the EAGLE-3 run grew from 9 GB to 24 GB resident in 180 steps and was killed for memory;
with a fixed threshold it stays near 9 GB.

``bound_allocator_growth`` fixes the threshold (which also turns off glibc's raising of it), so
blocks of 1 MiB or more are always mmapped and unmapped when freed, and trims the heap top above
16 MiB. It is the same as starting the process with ``MALLOC_MMAP_THRESHOLD_=1048576
MALLOC_TRIM_THRESHOLD_=16777216``, applied from Python. An mmap per large block costs a page
fault per 4 KiB touched, small beside a training step's matmuls.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

# mallopt(3) parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 1 << 20  # bytes: larger blocks are mmapped
TRIM_THRESHOLD = 16 << 20  # bytes: free heap top above this is returned to the system


def bound_allocator_growth() -> bool:
    """Apply the fixed thresholds (see the module docstring). Returns whether they were applied:
    False off Linux or on a C library without ``mallopt`` (musl), where nothing changes."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success, 0 on a rejected value.
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
