"""Collectives on CUDA tensors are timed by CUDA events, read lazily after the step.

This machine has no GPU, so the events here are stand-ins with the two methods the timing
code uses (``query()``, ``elapsed_time()`` in ms) and ``record()``; their clock is set by the
test. What this checks is the logic around them: a collective on a CUDA tensor takes its time
from the events (not from the host clock, which on NCCL only sees the launch), an event not
yet complete is left pending and read at a later snapshot, pending events are read oldest
first, async work's end event is recorded when its future completes, and CPU tensors keep the
host clock. The same path on a real GPU is
``tests/gpu/test_telemetry_gpu.py::test_all_reduce_time_is_device_time``.
"""

from __future__ import annotations

import time

import pytest
import torch

from workbench.engine import comm_timing


class StandInEvent:
    """A ``torch.cuda.Event(enable_timing=True)`` look-alike on a clock the test moves."""

    clock_ms = 0.0

    def __init__(self):
        self.at = None
        self.done = False

    def record(self):
        self.at = StandInEvent.clock_ms

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end) -> float:
        assert self.at is not None and end.at is not None, "elapsed_time of an unrecorded event"
        return end.at - self.at


class CudaLike:
    """A payload that says it lives on a GPU (``is_cuda``) and has a size."""

    is_cuda = True

    def numel(self):
        return 256

    def element_size(self):
        return 4


@pytest.fixture
def stats(monkeypatch):
    made: list[StandInEvent] = []

    def new_event():
        made.append(StandInEvent())
        return made[-1]

    s = comm_timing.CommStats(new_event=new_event)
    monkeypatch.setattr(comm_timing, "STATS", s)
    StandInEvent.clock_ms = 0.0
    return s, made


def _fake_all_reduce(device_ms: float):
    def all_reduce(tensor, op=None, group=None, async_op=False):
        StandInEvent.clock_ms += device_ms  # the device spends device_ms; the host returns at once
        return None

    return all_reduce


def test_a_cuda_collective_takes_its_time_from_events_when_they_complete(stats):
    s, made = stats
    timed = comm_timing._wrap("all_reduce", _fake_all_reduce(7.5))
    timed(CudaLike())
    assert len(made) == 2 and made[0].at == 0.0 and made[1].at == 7.5  # recorded around the call
    # counted at launch, no time yet: the end event has not completed
    snap = s.snapshot()
    assert snap["all_reduce"] == (1, 1024, 0.0) and snap["_blocking"] == 0.0
    assert s.resolve() == 1
    made[1].done = True
    snap = s.snapshot()  # reading the figures resolves what has completed
    assert snap["all_reduce"] == (1, 1024, pytest.approx(7.5e-3))
    assert snap["_blocking"] == pytest.approx(7.5e-3)
    (kind, start, end, blocking) = s.spans_since(0)[0]
    assert kind == "all_reduce" and blocking and end - start == pytest.approx(7.5e-3)
    assert s.resolve() == 0


def test_pending_events_are_read_oldest_first(stats):
    s, made = stats
    timed = comm_timing._wrap("all_reduce", _fake_all_reduce(1.0))
    timed(CudaLike())
    timed(CudaLike())
    made[3].done = True  # the second finished, the first not (another stream): keep launch order
    assert s.resolve() == 2 and s.spans_since(0) == []
    made[1].done = True
    assert s.resolve() == 0
    assert [round(b - a, 6) for _, a, b, _ in s.spans_since(0)] == [1e-3, 1e-3]
    assert s.snapshot()["all_reduce"][2] == pytest.approx(2e-3)


class StandInWork:
    """An ``async_op=True`` work whose future runs callbacks when the test completes it."""

    def __init__(self):
        self.callbacks = []

    def get_future(self):
        return self

    def add_done_callback(self, fn):
        self.callbacks.append(fn)

    def complete(self, device_ms: float):
        StandInEvent.clock_ms += device_ms  # the collective ran this long after its launch
        for fn in self.callbacks:
            fn(self)


def test_an_async_cuda_collective_ends_where_its_future_completes(stats):
    s, made = stats
    work = StandInWork()

    def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
        return work

    comm_timing._wrap("all_gather_into_tensor", all_gather_into_tensor)(CudaLike(), CudaLike(), async_op=True)
    assert made[0].at == 0.0 and made[1].at is None  # end not recorded at launch
    assert s.snapshot()["all_gather"][2] == 0.0
    work.complete(4.0)
    made[1].done = True
    (kind, start, end, blocking) = s.spans_since(0)[0]
    assert kind == "all_gather" and not blocking and end - start == pytest.approx(4e-3)
    assert s.snapshot()["_blocking"] == 0.0  # async work does not block the caller


def test_cpu_tensors_keep_the_host_clock(stats):
    s, made = stats

    def all_reduce(tensor, op=None, group=None, async_op=False):
        time.sleep(0.02)

    comm_timing._wrap("all_reduce", all_reduce)(torch.ones(8))
    assert made == []  # no events for a CPU tensor
    count, nbytes, seconds = s.snapshot()["all_reduce"]
    assert (count, nbytes) == (1, 32) and seconds >= 0.02


def test_no_cuda_timing_available_falls_back_to_the_host_clock(monkeypatch):
    def broken():
        raise RuntimeError("CUDA driver not initialised")

    s = comm_timing.CommStats(new_event=broken)
    monkeypatch.setattr(comm_timing, "STATS", s)
    comm_timing._wrap("all_reduce", _fake_all_reduce(3.0))(CudaLike())
    assert s.resolve() == 0 and s.snapshot()["all_reduce"][0] == 1


def test_a_loop_that_never_reads_its_figures_does_not_hold_events_without_bound(stats):
    s, made = stats
    timed = comm_timing._wrap("all_reduce", _fake_all_reduce(0.5))
    for _ in range(1100):
        timed(CudaLike())
        made[-1].done = True  # each completes before the next launch
    assert len(s._pending) <= 1025  # read once past 1024, without a snapshot
    assert s.snapshot()["all_reduce"][2] == pytest.approx(1100 * 0.5e-3)
