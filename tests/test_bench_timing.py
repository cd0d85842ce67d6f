"""bench/timing.py's CUDA timers, against a simulated host and GPU (no GPU needed).

The simulation keeps a host clock and the time at which the GPU's stream drains: a launch costs
the host `host_cost` and queues `kernel` seconds of GPU work; an event records when the stream
reaches it; torch.cuda._sleep queues cycles / rate seconds; a synchronize moves the host clock to
the drain time. time_cuda must report the kernel's GPU time however slow the host is, and
time_cuda_eager the host dispatch plus the kernel.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

import timing  # noqa: E402

SLEEP_RATE = 1.8e9  # simulated spin-kernel cycles per second


class FakeGPU:
    def __init__(self, host_cost: float, kernel: float, syncs: bool = False):
        self.host = 0.0      # host clock
        self.drain = 0.0     # when the stream has finished everything queued so far
        self.host_cost, self.kernel, self.syncs = host_cost, kernel, syncs

    def clock(self) -> float:
        return self.host

    def launch(self, seconds: float) -> None:
        self.host += self.host_cost
        self.drain = max(self.drain, self.host) + seconds

    def synchronize(self) -> None:
        self.host = max(self.host, self.drain)

    def fn(self, _r: int) -> None:  # the op under test
        self.launch(self.kernel)
        if self.syncs:  # e.g. an op that reads a result back with .item()
            self.synchronize()

    def install(self, monkeypatch) -> None:
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False):
                self.t = None

            def record(self):
                gpu.host += 1e-7
                self.t = max(gpu.drain, gpu.host)
                gpu.drain = self.t

            def synchronize(self):
                gpu.host = max(gpu.host, self.t)

            def elapsed_time(self, end) -> float:
                return (end.t - self.t) * 1e3

        monkeypatch.setattr(timing, "_clock", self.clock)
        monkeypatch.setattr(timing, "_SLEEP_CYCLES_PER_S", None)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", self.synchronize)
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: self.launch(cycles / SLEEP_RATE))


@pytest.mark.parametrize("host_cost,kernel", [(20e-6, 5e-6), (2e-6, 40e-6), (30e-6, 30e-6)])
def test_time_cuda_reports_gpu_time_and_eager_reports_latency(monkeypatch, host_cost, kernel):
    gpu = FakeGPU(host_cost, kernel)
    gpu.install(monkeypatch)
    assert timing.time_cuda(gpu.fn, 50) == pytest.approx(kernel, rel=1e-3)
    assert timing.time_cuda_eager(gpu.fn, 20) == pytest.approx(host_cost + kernel + 1e-7, rel=1e-2)


def test_time_cuda_falls_back_when_the_op_syncs(monkeypatch):
    """A host sync inside fn drains the queue: the spin cannot hide dispatch, so each call costs
    dispatch + kernel, and the timer must say so rather than report the kernel alone (or hang)."""
    gpu = FakeGPU(20e-6, 5e-6, syncs=True)
    gpu.install(monkeypatch)
    assert timing.time_cuda(gpu.fn, 30) == pytest.approx(25e-6, rel=1e-2)
