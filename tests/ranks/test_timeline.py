"""The per-rank step timeline on real gloo ranks (shared 2-rank set).

Claims tested: a step's phases (data, forward, backward, agreement, optimizer) cover its
measured duration except for at most max(5 %, 2 ms) of Python between them, no span lies
outside its step, and a rank made slow on purpose (a sleep in its data function) is the
straggler of every step: the one the other waits for. DDP's second step rebuilds its
gradient buckets with a broadcast from C++ that no wrapper sees: there the wait shows
inside forward, and the record says so in its notes.
"""

from __future__ import annotations

import pytest
from conftest import clean_trainer

from workbench.notebook.dashboard import timelines
from workbench.notebook.dashboard.timeline_figure import stragglers, timeline_figure, timeline_table

SLEEP_S = 0.3
STEPS = 4


def slow_trainer_on_rank(slow_rank: int, sleep_s: float, steps: int):
    """DDP tiny GPT; rank ``slow_rank`` sleeps ``sleep_s`` in every batch it loads."""
    import time

    import torch

    from workbench.engine import runtime
    from workbench.engine.trainer import Trainer
    from workbench.models import GPT, GPTConfig
    from workbench.strategies import prepare

    torch.manual_seed(0)
    cfg = GPTConfig.tiny()
    prepared = prepare(GPT(cfg), lambda ps: torch.optim.AdamW(ps, lr=1e-3), "ddp")
    rank = runtime.context().rank

    def data(i):
        if rank == slow_rank:
            time.sleep(sleep_s)
        g = torch.Generator().manual_seed(i * 10 + rank)
        x = torch.randint(0, cfg.vocab, (4, cfg.max_seq_len), generator=g)
        return x, torch.roll(x, -1, 1)

    t = Trainer(prepared, data=data)
    t.start(steps)
    return t.wait(120)["state"]


@pytest.fixture
def rs(current2):
    return current2


def test_phases_cover_the_step_and_the_slow_rank_is_the_straggler(rs):
    assert rs.apply(slow_trainer_on_rank, 1, SLEEP_S, STEPS) == ["finished", "finished"]
    recs = timelines.records(STEPS, rankset=rs)
    assert sorted((r["rank"], r["step"]) for r in recs) == [(r, s) for r in (0, 1) for s in range(1, STEPS + 1)]
    for rec in recs:
        for s in rec["spans"]:
            assert -1e-6 <= s["start"] <= s["end"] <= rec["duration"] + 1e-6, (rec["rank"], rec["step"], s)
    table = timeline_table(recs)
    uncovered = (1 - table["covered"]) * table["step_s"]
    assert (uncovered <= (0.05 * table["step_s"]).clip(lower=0.002)).all(), table[["rank", "step", "step_s", "covered"]]
    assert set(table.columns) >= {"data_s", "forward_s", "backward_s", "optimizer_s", "agreement_s", "waiting_s"}
    # the slow rank's data phase holds its sleep; the other rank waits about that long for it
    slow, fast = table[table["rank"] == 1], table[table["rank"] == 0]
    assert (slow["data_s"].values >= SLEEP_S).all()
    rebuilt = fast["notes"].str.contains("DDP rebuilt its gradient buckets")
    assert list(fast.loc[rebuilt, "step"]) == [2]
    # about its lateness (a loaded machine slows the waiting rank too, so not to the millisecond)
    assert (fast.loc[~rebuilt, "waiting_s"] >= 0.5 * SLEEP_S).all(), fast[["step", "waiting_s"]]
    assert (fast.loc[rebuilt, "forward_s"] >= 0.5 * SLEEP_S).all()
    assert stragglers(recs) == {s: 1 for s in range(1, STEPS + 1) if s != 2}  # step 2: see the module doc
    # DDP's bucket all-reduce is in rank 0's comm lane, its wait marked as waiting
    assert any(
        s["name"].startswith("all_reduce (DDP") and s["wait"] for r in recs if r["rank"] == 0 for s in r["spans"]
    )
    fig = timeline_figure(recs)
    assert f"straggler: rank 1 in {STEPS - 1}/{STEPS - 1} steps" in fig.layout.title.text
    assert "<sub>step 2, rank 0, 1: DDP rebuilt its gradient buckets" in fig.layout.title.text
    # the dashboard's panel draws the same chart
    from workbench.notebook.dashboard import Dashboard

    dash = Dashboard(rs, live=False)
    try:
        dash.timeline.steps.value = STEPS
        assert dash.timeline.refresh()
        assert dash.timeline.figure.layout.title.text == fig.layout.title.text
        assert {t.name for t in dash.timeline.figure.data} == {t.name for t in fig.data}
    finally:
        dash.close()
    drawn = {(t.name, lane) for t in fig.data for lane in t.y}
    assert {("data", "rank 1"), ("backward", "rank 0"), ("all_reduce (DDP buckets) (blocked)", "rank 0 comm")} <= drawn


def test_timeline_magic(shell, ranks4):
    ranks4.apply(clean_trainer, timeout=60)
    ranks4.apply(_forget_timeline)
    r = shell.run_cell("%distrain timeline")
    assert not r.success and "no steps recorded on the ranks yet" in str(r.error_in_exec)
    for line, fragment in (
        ("%distrain timeline --steps 0", "argument --steps: expected a whole number >= 1"),
        ("%distrain timeline --ranks 9", "9"),
    ):
        r = shell.run_cell(line)
        assert not r.success and fragment in str(r.error_in_exec)
    try:
        assert ranks4.apply(slow_trainer_on_rank, 2, SLEEP_S, 3) == ["finished"] * 4
        fig = shell.run_cell("%distrain timeline --steps 3 --ranks 1-2").result
        assert {lane for t in fig.data for lane in t.y} == {"rank 1", "rank 2", "rank 1 comm", "rank 2 comm"}
        # step 2 hides DDP's bucket-rebuild wait inside forward (see the module doc): not judged
        assert "straggler: rank 2 in 2/2 steps" in fig.layout.title.text, fig.layout.title.text
        table = shell.run_cell("%distrain timeline --steps 2 --table").result
        assert sorted(set(table["rank"])) == [0, 1, 2, 3] and sorted(set(table["step"])) == [2, 3]
    finally:
        ranks4.apply(clean_trainer, timeout=60)


def _forget_timeline():
    from workbench.engine import timeline

    timeline.clear()
