"""The trainer's phase clock: host time on CPU, CUDA events read once per step on a GPU.

This machine has no GPU, so the device clock runs here on stand-in events (``record``,
``query``, ``synchronize``, ``elapsed_time`` in ms, as ``torch.cuda.Event(enable_timing=True)``)
over a modelled device: a queue whose kernels the test launches with a device duration, and
which an event reaches only once the work queued before it is done. An event not reached by
the host's present time is incomplete, and reading its time is an error, as with CUDA. What
this checks is the logic: a phase's figure is the device time between its events (not the
host's launch time), nothing waits per phase, the one wait is for the step's last event,
spans sit on the host clock, events are reused across steps. The same clock on a real GPU
runs in ``tests/gpu/test_telemetry_gpu.py`` (the trainer's step times against wall time).
"""

from __future__ import annotations

import types

import pytest

from workbench.engine import telemetry

MS = 1e-3


class Device:
    """One CUDA stream in order, on a clock the test moves (host and device share it, in ms)."""

    def __init__(self):
        self.host_ms = 0.0  # the host's present
        self.free_ms = 0.0  # when the queued work is done
        self.waits: list[int] = []  # ordinal of each event the host synchronised on
        self.made: list[StandInEvent] = []

    def host(self, ms: float) -> None:
        """The host spends ``ms`` in Python (no kernels)."""
        self.host_ms += ms

    def launch(self, device_ms: float, host_ms: float = 0.0) -> None:
        """Kernels taking ``device_ms`` on the device, launched over ``host_ms`` of host time."""
        self.free_ms = max(self.free_ms, self.host_ms) + device_ms
        self.host_ms += host_ms

    def wait(self) -> None:
        """The host blocks until the device has done its queue (``loss.item()``)."""
        self.host_ms = max(self.host_ms, self.free_ms)

    def new_event(self):
        self.made.append(StandInEvent(self, len(self.made)))
        return self.made[-1]

    def perf_counter(self) -> float:
        return self.host_ms * MS


class StandInEvent:
    """Stands in for ``torch.cuda.Event(enable_timing=True)``, which cannot run without CUDA."""

    def __init__(self, device: Device, ordinal: int):
        self.device, self.ordinal, self.at = device, ordinal, None

    def record(self) -> None:
        d = self.device
        self.at = d.free_ms = max(d.free_ms, d.host_ms)  # reached once the queue before it is done

    def query(self) -> bool:
        return self.at is not None and self.at <= self.device.host_ms

    def synchronize(self) -> None:
        self.device.waits.append(self.ordinal)
        self.device.host_ms = max(self.device.host_ms, self.at)

    def elapsed_time(self, end) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return end.at - self.at


@pytest.fixture
def device(monkeypatch):
    d = Device()
    monkeypatch.setattr(telemetry, "time", types.SimpleNamespace(perf_counter=d.perf_counter))
    return d


def _one_step(clock, d: Device) -> None:
    """The trainer's phases, with a GPU that is the bottleneck: forward and backward launch
    far faster than they run, the loss and the gradient norm are read on the host."""
    with clock.phase("zero_grad"):
        d.host(0.1)
    with clock.phase("data"):
        d.host(1.0)  # host-only, device idle: counts in full
    with clock.phase("forward"):
        d.launch(40.0, host_ms=5.0)
    d.wait()  # float(loss)
    with clock.phase("backward"):
        d.launch(80.0, host_ms=10.0)
    with clock.phase("optimizer"):  # the norm, read on the host
        d.launch(2.0, host_ms=0.1)
        d.wait()
    with clock.phase("agreement"):
        d.host(0.5)
    with clock.phase("optimizer"):  # the optimizer's step, launched and left running
        d.launch(3.0, host_ms=0.2)


def test_device_clock_reports_device_time_and_waits_once_per_step(device):
    d = device
    clock = telemetry.PhaseClock(d.new_event)
    d.host(7.0)  # the step starts at host time 7 ms, the device idle
    _one_step(clock, d)
    assert d.waits == [] and clock.seconds == {} and clock.spans == []  # nothing read, nothing waited
    launched_by = d.host_ms
    end = clock.resolve()
    assert d.waits == [len(d.made) - 1], "one wait per step, for its last event"
    assert d.host_ms > launched_by  # the host waited for the optimizer's kernels
    want = {"zero_grad": 0.1, "data": 1.0, "forward": 40.0, "backward": 80.0, "optimizer": 5.0, "agreement": 0.5}
    assert clock.seconds == pytest.approx({k: v * MS for k, v in want.items()})
    # the host clock would have seen the launches: forward 5 ms, backward 10 ms
    names = [s[0] for s in clock.spans]
    assert names == ["zero_grad", "data", "forward", "backward", "optimizer", "agreement", "optimizer"]
    forward = clock.spans[2]
    assert forward[1] == pytest.approx(8.1 * MS) and forward[2] == pytest.approx(48.1 * MS)
    # the step ends where the device met its last event, which is where the wait ended
    assert end == clock.spans[-1][2] == pytest.approx(d.host_ms * MS) == pytest.approx(133.6 * MS)
    for (_, a, b), (_, c, _) in zip(clock.spans, clock.spans[1:]):
        assert a <= b <= c  # in order, on the host clock


def test_device_clock_reuses_its_events_step_after_step(device):
    d = device
    clock = telemetry.PhaseClock(d.new_event)
    figures = []
    for _ in range(3):
        clock.reset()
        _one_step(clock, d)
        clock.resolve()
        figures.append(dict(clock.seconds))
        d.host(2.0)  # the trainer's bookkeeping between steps
    assert len(d.made) == 14  # 7 phases, two events each, made in the first step only
    assert figures[0] == pytest.approx(figures[1]) and figures[1] == pytest.approx(figures[2])
    assert len(d.waits) == 3


def test_a_phase_that_raises_is_still_timed(device):
    d = device
    clock = telemetry.PhaseClock(d.new_event)
    with pytest.raises(ValueError):
        with clock.phase("forward"):
            d.launch(12.0, host_ms=1.0)
            raise ValueError("a bad batch")
    clock.resolve()
    assert clock.seconds == pytest.approx({"forward": 12.0 * MS})


def test_host_clock_is_the_host_time_of_each_phase(device):
    d = device
    clock = telemetry.PhaseClock()
    d.host(3.0)
    _one_step(clock, d)
    assert clock.resolve() is None  # nothing to read on a host clock
    assert d.made == [] and d.waits == []
    # the launches only; the wait for backward's kernels lands in the optimizer's norm read
    want = {"zero_grad": 0.1, "data": 1.0, "forward": 5.0, "backward": 10.0, "optimizer": 72.2, "agreement": 0.5}
    assert clock.seconds == pytest.approx({k: v * MS for k, v in want.items()})
    assert clock.spans[0] == ("zero_grad", pytest.approx(3.0 * MS), pytest.approx(3.1 * MS))
