"""``%distrain profile`` on live gloo ranks (shared 2-rank set): a Chrome trace per rank that
loads as JSON with ``traceEvents`` and holds exactly the profiled steps, a summary naming
the top op, and nothing left running on the ranks (profiler off, hook gone)."""

from __future__ import annotations

import json

import pytest

from workbench.notebook import profiles, training
from workbench.notebook.commands import UsageError, dispatch
from workbench.shared.errors import WorkbenchError


@pytest.fixture
def rs(current2):
    return current2


def _left_running():
    import torch

    from workbench.engine import profiling, trainer

    t = trainer._CURRENT
    hooks = [h for h in (t.hooks if t else []) if getattr(h[0], "__qualname__", "").startswith("arm.")]
    return {
        "profiler_on": torch.autograd.profiler._is_profiler_enabled,
        "hooks": len(hooks),
        "done": profiling.status()["done"],
        "threads": sorted(th.name for th in __import__("threading").enumerate() if "profil" in th.name.lower()),
    }


def _names(path) -> list[str]:
    with open(path) as f:
        trace = json.load(f)
    return [e.get("name", "") for e in trace["traceEvents"]]


def test_profile_an_idle_trainer_then_a_running_one(rs, tmp_path):
    with pytest.raises(UsageError, match="no trainer on this rank"):
        dispatch("profile --steps 2")
    training.setup("ddp", rankset=rs)
    prof = profiles.profile(2, rankset=rs, out=str(tmp_path / "idle"))
    assert sorted(prof.files) == [0, 1]
    for r, path in prof.files.items():
        names = _names(path)  # loads as JSON with traceEvents
        assert sum(n.startswith("ProfilerStep#") for n in names) == 2
        assert prof.summary.loc[r, "top_op"] in names
        row = prof.summary.loc[r]
        assert abs(row["compute_ms"] + row["comm_ms"] + row["idle_ms"] - row["window_ms"]) < 1e-6
        assert row["comm_ms"] > 0  # DDP's gradient all-reduce (gloo) is in the trace
    assert prof.top_ops["op"].iloc[0] in set(prof.summary["top_op"]) | set(prof.top_ops["op"])
    assert prof.top_ops["self_ms"].is_monotonic_decreasing
    assert all(s == {"profiler_on": False, "hooks": 0, "done": True, "threads": []} for s in rs.apply(_left_running))
    # a running trainer: profiled where it is, through the magic's path, on one rank
    training.start(40, rankset=rs)
    try:
        prof = dispatch(f"profile --steps 2 --ranks 1 --dir {tmp_path / 'running'}")
        assert list(prof.files) == [1] and prof.files[1].endswith("rank1.trace.json")
        assert sum(n.startswith("ProfilerStep#") for n in _names(prof.files[1])) == 2
    finally:
        training.stop(rankset=rs)
        training.wait(timeout=60, rankset=rs)
    assert all(s["profiler_on"] is False and s["hooks"] == 0 for s in rs.apply(_left_running))


def test_profile_refuses_bad_input(rs):
    for line, fragment in (
        ("profile --steps 0", "argument --steps: expected a whole number >= 1"),
        ("profile --ranks 5", "rank\\(s\\) 5 do not exist"),
        ("profile --timeout -1", "argument --timeout: expected a positive number of seconds"),
    ):
        with pytest.raises(WorkbenchError, match=fragment):  # UsageError, or BadRanks for --ranks
            dispatch(line)
    training.setup("ddp", rankset=rs)
    training.start(3, rankset=rs)
    try:
        with pytest.raises(UsageError, match="step\\(s\\) left of its run"):
            dispatch("profile --steps 50")
    finally:
        training.wait(timeout=60, rankset=rs)
    assert all(s["profiler_on"] is False and s["hooks"] == 0 for s in rs.apply(_left_running))


def _trainer_state():
    from workbench.engine import trainer

    return trainer.current().state


def test_profile_some_ranks_of_an_idle_trainer_is_refused_at_once(rs):
    """A step needs every rank: arming rank 1 alone used to start its trainer there, which then
    waited for rank 0 until --timeout ran out. Now it is refused before anything is armed."""
    import time

    training.setup("ddp", rankset=rs)
    t0 = time.monotonic()
    with pytest.raises(UsageError) as err:
        dispatch("profile --steps 2 --ranks 1 --timeout 120")
    assert time.monotonic() - t0 < 60  # refused, not timed out (the timeout is 120 s)
    msg = str(err.value)
    assert "no training steps are running (the trainer is idle)" in msg
    assert "%distrain train start" in msg and "--code" in msg
    assert rs.apply(_trainer_state) == ["idle", "idle"]  # rank 1's trainer was not started alone
    assert all(s["profiler_on"] is False and s["hooks"] == 0 for s in rs.apply(_left_running))


CELL = (
    "import torch, torch.distributed as dist\n"
    "for _ in range(4):\n"
    "    profiled_a = torch.randn(192, 192) @ torch.randn(192, 192)\n"
    "dist.all_reduce(profiled_a)\n"
)


def test_profile_a_cell(rs, tmp_path):
    prof = profiles.profile_cell(CELL, rankset=rs, out=str(tmp_path))
    for r, path in prof.files.items():
        names = _names(path)
        assert "aten::mm" in names and prof.summary.loc[r, "top_op"] in names
        assert prof.summary.loc[r, "comm_ms"] > 0  # the all_reduce
    assert rs.pull("profiled_a")[0].shape == (192, 192)  # ran in the ranks' namespaces
    assert all(s["profiler_on"] is False for s in rs.apply(_left_running))
    rs.execute("del profiled_a")
    with pytest.raises(UsageError, match="--code is empty"):
        dispatch("profile --code ' '")
