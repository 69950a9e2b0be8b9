"""The trainer reads its phase clock once per step: on a GPU, a CUDA event per phase boundary
and one wait at the step's end, instead of a synchronise at every phase end.

No GPU here, so the ranks' trainers (shared 2-rank set, DDP on gloo) get a device clock on
stand-in events (they stand in for ``torch.cuda.Event(enable_timing=True)``, which cannot run
without CUDA) whose device runs one second behind in every phase, and which are complete only
once the host has synchronised on them or a later event, as on one CUDA stream. What this
checks is the trainer's wiring: every step's figures and timeline spans come from the events,
each step waits exactly once, for its last event, and nothing reads an event before that.
"""

from __future__ import annotations

import time

import pytest

from workbench.engine import trainer
from workbench.notebook import training
from workbench.notebook.metrics import metrics

LAG_S = 1.0  # device time added inside every phase: far above a tiny model's host step


class _Device:
    def __init__(self):
        self.made: list = []
        self.synced = -1  # the highest ordinal synchronised on in this step
        self.recorded = -1  # the highest ordinal recorded in this step
        self.waits: list[tuple[int, int]] = []  # (ordinal waited on, highest recorded then)


class _LaggingEvent:
    """Stands in for ``torch.cuda.Event(enable_timing=True)``: event ``i`` of a step (the clock
    reuses them in order, a phase's start even, its end odd) is met LAG_S x (i + 1) // 2 late."""

    def __init__(self, device: _Device):
        self.device, self.ordinal, self.at = device, len(device.made), None
        device.made.append(self)

    def record(self):
        d = self.device
        if self.ordinal == 0:  # a new step
            d.synced = d.recorded = -1
        d.recorded = max(d.recorded, self.ordinal)
        self.at = time.perf_counter() + LAG_S * ((self.ordinal + 1) // 2)

    def query(self) -> bool:
        return self.ordinal <= self.device.synced

    def synchronize(self):
        d = self.device
        d.waits.append((self.ordinal, d.recorded))
        d.synced = max(d.synced, self.ordinal)

    def elapsed_time(self, end) -> float:
        if not (self.query() and end.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time.")
        return (end.at - self.at) * 1e3


def _lagging_clock() -> bool:
    from workbench.engine import telemetry

    t = trainer.current()
    t.stand_in = _Device()
    t._clock = telemetry.PhaseClock(lambda: _LaggingEvent(t.stand_in))
    return True


def _read() -> dict:
    from workbench.engine import timeline

    t = trainer.current()
    return {"waits": t.stand_in.waits, "timeline": timeline.recent(3, run=t.run)}


@pytest.fixture
def rs(current2):
    return current2


def test_a_device_clock_is_read_once_per_step_and_gives_the_step_figures(rs):
    training.setup("ddp", rankset=rs)
    assert rs.apply(_lagging_clock) == [True, True]
    run = training.start(3, rankset=rs)
    assert training.wait(timeout=120, rankset=rs) == {0: "finished", 1: "finished"}
    w = metrics(run, wide=True)
    assert len(w) == 6  # 3 steps x 2 ranks
    for _, row in w.iterrows():
        # the step runs to where the device met its last event: 8 phases (9 with the first
        # step's setup), each LAG_S late, none of which the host clock would see
        assert row.time_step_s >= 8 * LAG_S, row.step
        for phase in ("data", "forward", "backward"):
            assert LAG_S <= row[f"time_{phase}_s"] < LAG_S + row.time_step_s, (phase, row.step)
        # the optimizer is two phases (clip, then the update after the agreement)
        assert 2 * LAG_S <= row.time_optimizer_s < 2 * LAG_S + row.time_step_s
    for r, seen in enumerate(rs.apply(_read)):
        # one wait per step, on the last event the step recorded: no wait per phase
        assert len(seen["waits"]) == 3, (r, seen["waits"])
        assert all(ordinal == highest for ordinal, highest in seen["waits"]), (r, seen["waits"])
        for rec in seen["timeline"]:
            mine = w[(w["rank"] == r) & (w.step == rec["step"])].iloc[0]
            (forward,) = [s for s in rec["spans"] if s["lane"] == "phase" and s["name"] == "forward"]
            assert forward["end"] - forward["start"] == pytest.approx(mine.time_forward_s, abs=1e-6)
            assert max(s["end"] for s in rec["spans"] if s["lane"] == "phase") <= rec["duration"] + 1e-6
