"""Timing shared by the benchmarks: medians over repeats, and the measured HBM bandwidth.

On CUDA two measures: ``time_cuda``, the GPU time of a call (the kernels' own speed, what a
bandwidth or kernel-to-kernel comparison needs), and ``time_cuda_eager``, the latency of one call
issued to an idle GPU with the host's dispatch included.

``fn(r)`` is called with the repeat index so a bench can rotate input copies (``r % copies``) and
keep them out of the caches. All results are in seconds.
"""

from __future__ import annotations

import statistics
import time

import torch

_clock = time.perf_counter  # host clock (a module attribute so tests can simulate host and GPU)


def time_cpu(fn, repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``fn(r)`` over ``repeats`` calls."""
    for r in range(warmup):
        fn(r)
    times = []
    for r in range(repeats):
        start = _clock()
        fn(r)
        times.append(_clock() - start)
    return statistics.median(times)


def time_cuda_eager(fn, repeats: int, warmup: int = 3) -> float:
    """Median CUDA-event time of one ``fn(r)`` issued to an idle GPU: the latency a caller sees,
    host-side dispatch included (the GPU waits for the launch between the two events)."""
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


_SLEEP_CYCLES_PER_S: float | None = None


def _sleep_cycles_per_s() -> float:
    """Clock rate of torch.cuda._sleep (a spin kernel counting SM cycles), measured once."""
    global _SLEEP_CYCLES_PER_S
    if _SLEEP_CYCLES_PER_S is None:
        cycles = 20_000_000
        torch.cuda._sleep(1000)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SLEEP_CYCLES_PER_S = cycles / (start.elapsed_time(end) / 1e3)
    return _SLEEP_CYCLES_PER_S


def time_cuda(fn, repeats: int, warmup: int = 3, rounds: int = 5) -> float:
    """GPU time of one ``fn(r)``: the median over ``rounds`` of (CUDA-event time of ``repeats``
    back-to-back calls) / repeats.

    Each round first parks the GPU in a spin kernel long enough for the host to enqueue all the
    calls, so the events time the kernels alone, not the host's per-call dispatch (which
    time_cuda_eager includes, and which at a few microseconds per call would otherwise dominate
    small kernels). The spin is checked to have outlasted the enqueueing; if ``fn`` synchronises
    with the host, or the host is too slow even for a doubled spin, the round falls back to timing
    the calls back to back without it (then host time is included, as in an engine without graphs).
    """
    for r in range(warmup):
        fn(r)
    torch.cuda.synchronize()
    t0 = _clock()
    for r in range(repeats):
        fn(r)
    host_s = _clock() - t0  # enqueue time, an upper bound when the GPU kept up
    torch.cuda.synchronize()
    cycles_per_s = _sleep_cycles_per_s()
    spin_s = 2 * host_s + 1e-3
    per_call = []
    while len(per_call) < rounds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = _clock()
        torch.cuda._sleep(int(spin_s * cycles_per_s))
        start.record()
        for r in range(repeats):
            fn(r)
        end.record()
        enqueued_s = _clock() - t0
        end.synchronize()
        if enqueued_s < 0.8 * spin_s:  # the spin was still running: the queue never ran dry
            per_call.append(start.elapsed_time(end) / 1e3 / repeats)
        elif spin_s < 16 * (2 * host_s + 1e-3):
            spin_s *= 2
        else:  # fn syncs with the host, or the host cannot get ahead: time it as it is
            start.record()
            for r in range(repeats):
                fn(r)
            end.record()
            end.synchronize()
            per_call.append(start.elapsed_time(end) / 1e3 / repeats)
    return statistics.median(per_call)


def hbm_bytes_per_s(size: int = 1 << 31) -> float:
    """Bytes per second of a device-to-device copy of ``size`` bytes (read + write)."""
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    seconds = time_cuda_eager(lambda _: dst.copy_(src), 10)  # 1 ms per copy: dispatch is noise
    del src, dst
    return 2 * size / seconds
