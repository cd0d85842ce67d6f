"""Timing shared by the benchmarks: medians over repeats, and the measured HBM bandwidth.

``fn(r)`` is called with the repeat index so a bench can rotate input copies (``r % copies``) and
keep them out of the caches. All results are in seconds.
"""

from __future__ import annotations

import statistics
import time

import torch


def time_cpu(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn(r)`` over ``repeats`` calls."""
    for r in range(warmup):
        fn(r)
    times = []
    for r in range(repeats):
        start = time.perf_counter()
        fn(r)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_cuda(fn, repeats: int, warmup: int = 3) -> float:
    """Median CUDA-event time of ``fn(r)`` over ``repeats`` calls (after ``warmup`` calls)."""
    for r in range(warmup):
        fn(r)
    torch.cuda.synchronize()
    times = []
    for r in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(r)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def hbm_bytes_per_s(size: int = 1 << 31) -> float:
    """Bytes per second of a device-to-device copy of ``size`` bytes (read + write)."""
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = time_cuda(lambda _: dst.copy_(src), 10)
    del src, dst
    return 2 * size / seconds
