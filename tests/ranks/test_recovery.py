"""A failure budget (``train start --max-failures K``): the workbench recovers a run by itself.

Nobody types after the start: a rank kills itself from a step hook (SIGKILL, as the OOM
killer or a lost node would end it), or the setup plants a NaN loss the guard pauses on and
a step hook that hangs; the test only waits. Fresh rank sets: they die or are restarted.
"""

from __future__ import annotations

import pytest

from workbench.notebook import api, metrics, session, training
from workbench.notebook import checkpoints as ck
from workbench.notebook.commands import UsageError, dispatch
from workbench.notebook.setup_recipe import NO_SETUP
from workbench.shared.errors import BudgetSpent

# rank 1 ends itself with SIGKILL right after step AT (a step hook on its training thread); with
# FLUSH its step events are handed on first, so the notebook has every step it took (the kill of a
# rank whose sender had sent them), else they may die with it (the tests of held events below)
KILL_HOOK = """
import os, signal
from workbench.engine import publisher, trainer as _t
def _crash(record, _at={at}):
    if record["step"] == _at:
        {flush}publisher.flush()
        os.kill(os.getpid(), signal.SIGKILL)
_t.current().add_hook(_crash, pauses=False)
"""

# from step AT on, rank 1's step events wait in the rank: its sender (once what it queued before is
# handed on) sends into a ZMQ socket that connects to nobody, as events still queued on a rank
# are when it is killed before its sender sends them
HOLD_HOOK = """
import zmq
from workbench.engine import publisher, trainer as _t
def _hold(record, _at={at}):
    if record["step"] == _at:
        p = publisher.get()
        p.flush()
        nowhere = p._ctx.socket(zmq.PUSH)
        nowhere.connect({nowhere!r})
        p._handed_on, p._sock = p._sock, nowhere  # the old one kept open: it sends what it was handed
_t.current().add_hook(_hold, pauses=False)
"""

# the first build meets a NaN loss at step 15 (the guard pauses the run); every later one
# hangs after step 15 on rank 1 (a step hook that waits for a file the test writes): a NaN
# recovered, then a hang
DRILL_SETUP = """
import os, time
from workbench.engine import control, trainer
control.build_default("ddp")
_t = trainer.current()
_mark = os.path.join({folder!r}, f"built-{{_t.rank}}")
def _hang(record, _release=os.path.join({folder!r}, "release")):
    deadline = time.monotonic() + 600
    while record["step"] == 15 and not os.path.exists(_release) and time.monotonic() < deadline:
        time.sleep(0.1)
if not os.path.exists(_mark):
    open(_mark, "w").close()
    _t.inject("nan", 15)
elif _t.rank == 1:
    _t.add_hook(_hang, pauses=False)
"""

# build 1: rank 1 hangs after step 15 (past --step-timeout); every later build: rank 1 is SIGKILLed
# after step 25, its step events handed on first. With a budget of 2: the hang and the first death
# are recovered, the second death spends the budget
HANG_THEN_DEATHS = """
import os, signal, time
from workbench.engine import control, publisher, trainer
control.build_default("ddp")
_t = trainer.current()
_builds = os.path.join({folder!r}, f"builds-{{_t.rank}}")
_n = len(open(_builds).read()) if os.path.exists(_builds) else 0
open(_builds, "a").write("x")
def _die(record):
    if record["step"] == 25:
        publisher.flush()
        os.kill(os.getpid(), signal.SIGKILL)
if _t.rank == 1 and _n == 0:
    _t.add_hook(lambda record: record["step"] == 15 and time.sleep(600), pauses=False)
elif _t.rank == 1:
    _t.add_hook(_die, pauses=False)
"""


def test_a_killed_rank_is_recovered_and_the_run_reaches_its_step(fresh_ranks, tmp_path, capsys):
    root = str(tmp_path)
    rs = fresh_ranks(2)
    training.setup("ddp", rankset=rs)
    ck.autosave(10, keep=3, async_=False, root=root, rankset=rs)  # sync: step 20 is on disk at step 21
    api.run(KILL_HOOK.format(at=25, flush=""), ranks=[1], display=False)
    from workbench.notebook.dashboard import dashboard

    dash = dashboard(rs, show=False)
    try:
        run = training.start(80, max_failures=2, rankset=rs)
        assert training.wait(timeout=300) == {0: "finished", 1: "finished"}  # only waiting
        sess = api.session()
        assert sess.rankset is not rs and not rs.running and sess.rankset.world_size == 2
        (rec,) = sess.recoveries
        assert (rec["kind"], rec["rank"], rec["detail"]) == ("died", 1, "killed by SIGKILL"), rec
        # every step rank 1 took reached the notebook (it handed them on before the kill): the newest
        # checkpoint, step 20, is loaded and the 5 steps after it are redone
        ck_step = 20
        assert rec["passed_over"] is None and rec["lost"] == [], rec
        assert (rec["checkpoint"], rec["checkpoint_step"]) == ("step-00000020", 20), rec
        assert (rec["failed_step"], rec["steps_redone"]) == (25, 5) and rec["down_s"] > 0, rec
        assert rec["lost_s"] is not None and rec["lost_s"] >= rec["down_s"], rec
        assert sess.runs.current.state == "finished" and sess.runs.current.failures == 1
        frame = metrics.metrics()
        assert set(frame["run"]) == {run}  # the recovered trainer's steps continue the same run
        loss = frame[frame["metric"] == "loss"]
        for rank in (0, 1):  # every step exactly once: the redone ones replaced, not doubled
            assert loss[loss["rank"] == rank]["step"].tolist() == list(range(1, 81))
        assert [s["step"] for s in training.status()] == [80, 80]
        assert sess.dashboard.live is dash and dash.rankset is sess.rankset and not dash.closed  # followed the run
        dash.refresh()
        assert "recovered: failure 1: rank 1" in dash.status_line(run)
        assert [(m.x0, m.line.dash) for m in dash.figure.layout.shapes] == [(ck_step, "dot")]
        capsys.readouterr()
        dispatch("train status")
        out = capsys.readouterr().out
        assert f"training {run}: finished; failure budget 1/2 used, target step 80" in out
        assert "failure 1: rank 1 (host " in out and "died at step" in out and "killed by SIGKILL" in out
        assert f"restarted 2 ranks, loaded step-000000{ck_step} (step {ck_step})" in out and "s lost" in out
    finally:
        api.session().checkpoints.autosave = None


@pytest.mark.parametrize("held_from", [15, 5])
def test_steps_a_killed_rank_never_delivered_are_redone_from_an_older_checkpoint(
    fresh_ranks, tmp_path, capsys, held_from
):
    """Rank 1 is killed at step 25 with its events from step HELD_FROM on still in it, after the
    saves of steps 10 and 20: step 20's checkpoint would leave those steps out of the metrics for
    good, so the recovery loads the newest one at or before step HELD_FROM and says why; where
    there is none (HELD_FROM 5) it loads the newest and says which steps of rank 1 were lost."""
    root = str(tmp_path / "ckpt")
    rs = fresh_ranks(2)
    training.setup("ddp", rankset=rs)
    ck.autosave(10, keep=3, async_=False, root=root, rankset=rs)
    nowhere = f"ipc://{tmp_path}/nobody-reads-this"
    api.run(
        HOLD_HOOK.format(at=held_from, nowhere=nowhere) + KILL_HOOK.format(at=25, flush="# "), ranks=[1], display=False
    )
    try:
        run = training.start(60, max_failures=1, rankset=rs)
        assert training.wait(timeout=300) == {0: "finished", 1: "finished"}
        sess = api.session()
        (rec,) = sess.recoveries
        assert (rec["kind"], rec["rank"], rec["detail"]) == ("died", 1, "killed by SIGKILL"), rec
        assert rec["passed_over"] == (
            {"checkpoint": "step-00000020", "step": 20, "rank": 1, "last_step": held_from} if held_from == 15 else None
        ), rec
        ck_step = 10 if held_from == 15 else 20
        assert (rec["checkpoint"], rec["checkpoint_step"]) == (f"step-000000{ck_step}", ck_step), rec
        lost = [] if held_from == 15 else [{"rank": 1, "first": held_from + 1, "last": 20}]
        assert rec["lost"] == lost, rec
        # the run's step when rank 1 died in step 25's hook: rank 0's step 25, which it had sent (rank 1's
        # own events are held from HELD_FROM)
        assert (rec["failed_step"], rec["steps_redone"]) == (25, 25 - ck_step), rec
        loss = metrics.metrics()
        loss = loss[loss["metric"] == "loss"]
        assert loss[loss["rank"] == 0]["step"].tolist() == list(range(1, 61))  # every step once
        missing = set(range(held_from + 1, 21)) if lost else set()
        assert loss[loss["rank"] == 1]["step"].tolist() == [s for s in range(1, 61) if s not in missing]
        capsys.readouterr()
        dispatch("train status")
        out = capsys.readouterr().out
        assert f"loaded step-000000{ck_step} (step {ck_step})" in out, out
        if lost:
            assert f"steps {held_from + 1}-20 of rank 1 were lost (they never reached the notebook" in out, out
        else:
            assert f"not step-00000020 (step 20): rank 1's steps after {held_from} never reached the notebook" in out
        assert set(metrics.metrics()["run"]) == {run}
    finally:
        api.session().checkpoints.autosave = None


def test_a_nan_is_recovered_then_a_hang_spends_the_budget(fresh_ranks, tmp_path, ipshell, capsys):
    root = str(tmp_path / "ckpt")
    rs = fresh_ranks(2)
    setup = DRILL_SETUP.format(folder=str(tmp_path))
    api.run(setup, display=False)
    ck.autosave(10, keep=3, async_=False, root=root, rankset=rs)
    ipshell.user_ns["drill_setup"] = setup
    try:
        dispatch(
            "train start --steps 40 --max-failures 1 --step-timeout 10 --setup drill_setup --no-dashboard", ipshell
        )
        with pytest.raises(BudgetSpent) as spent:
            training.wait(timeout=300)
        text = str(spent.value)
        first = text.splitlines()[0]
        assert "failure budget spent (1 of 1 recoveries used); rank 1 (host " in first, text
        assert "hung at step 15: training run-" in first and "(step timeout 10 s)" in first, text
        assert "restart --load" in first, text
        (rec,) = api.session().recoveries
        assert (rec["kind"], rec["failed_step"], rec["checkpoint_step"]) == ("paused on its loss", 15, 10), rec
        assert "non-finite loss" in rec["detail"] and rec["steps_redone"] == 5, rec
        assert "failure 1: rank 0 (host " in text and "loaded step-00000010 (step 10), 5 steps redone" in text, text
        sess = api.session()
        assert sess.runs.current.state == "gave up" and sess.rankset is not rs and sess.rankset.dead() == []
        assert sess.hangs and sess.hangs[-1]["stuck"] == [1]  # the watchdog's diagnosis, kept
        capsys.readouterr()
        dispatch("train status")
        out = capsys.readouterr().out
        assert "gave up; failure budget 1/1 used" in out and "failure budget spent" in out
        # the ranks were told to stop when it gave up: once rank 1's hang ends, both stop there
        # instead of training on to step 40
        (tmp_path / "release").touch()
        assert _wait(lambda: training.states() == {0: "stopped", 1: "stopped"}, 60), training.states()
        assert [s["state"] for s in training.status()] == ["stopped", "stopped"]
        assert max(s["step"] for s in training.status()) <= 16, training.status()
    finally:
        ipshell.user_ns.pop("drill_setup", None)
        api.session().checkpoints.autosave = None


def test_a_hang_and_a_death_are_recovered_and_the_next_death_spends_a_budget_of_two(
    fresh_ranks, tmp_path, ipshell, capsys
):
    """Budget 2: rank 1 hangs past --step-timeout (recovered from step 10), then dies at step 25
    (recovered from step 20), then dies there again: the budget is spent on a death, the summary
    names it, and nothing trains on: the dead rank is left as it is, the survivor's run ended."""
    from workbench.engine import rpc

    root = str(tmp_path / "ckpt")
    rs = fresh_ranks(2)
    setup = HANG_THEN_DEATHS.format(folder=str(tmp_path))
    api.run(setup, display=False)
    ck.autosave(10, keep=3, async_=False, root=root, rankset=rs)
    ipshell.user_ns["drill_setup"] = setup
    try:
        dispatch(
            "train start --steps 40 --max-failures 2 --step-timeout 10 --setup drill_setup --no-dashboard", ipshell
        )
        with pytest.raises(BudgetSpent) as spent:
            training.wait(timeout=300)
        first = str(spent.value).splitlines()[0]
        assert "failure budget spent (2 of 2 recoveries used); rank 1 (host " in first, first
        assert "died at step 25: killed by SIGKILL" in first, first
        hang, death = api.session().recoveries
        assert (hang["kind"], hang["rank"], hang["failed_step"]) == ("hung", 1, 15), hang
        assert (hang["checkpoint_step"], hang["steps_redone"]) == (10, 5), hang
        assert (death["kind"], death["rank"], death["detail"]) == ("died", 1, "killed by SIGKILL"), death
        assert (death["checkpoint_step"], death["failed_step"], death["steps_redone"]) == (20, 25, 5), death
        sess = api.session()
        assert sess.runs.current.state == "gave up" and sess.runs.current.failures == 2
        last = sess.rankset
        assert [d["rank"] for d in last.dead()] == [1]  # left for a person to look at

        def survivor():
            (status,) = last.apply(rpc.handle, rpc.TrainerStatus(), ranks=[0])
            return status

        # the survivor's run ended (its collective with the dead rank failed): it takes no more steps
        assert _wait(lambda: survivor().state in ("error", "stopped"), 60), survivor()
        assert survivor().step == 25, survivor()
    finally:
        ipshell.user_ns.pop("drill_setup", None)
        api.session().checkpoints.autosave = None


def _wait(predicate, timeout: float) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_max_failures_without_a_setup_is_refused_before_anything_changes(current2):
    sess = session.of(current2)
    kept = sess.setup.recipe, sess.setup.given
    sess.setup.recipe = sess.setup.given = None
    run_before = sess.runs.current
    try:
        with pytest.raises(UsageError) as refused:
            dispatch("train start --steps 5 --max-failures 2 --no-dashboard")
        assert str(refused.value) == NO_SETUP
        with pytest.raises(UsageError, match="--setup names the code a recovery repeats"):
            dispatch("train start --steps 5 --setup code --no-dashboard")
        with pytest.raises(UsageError, match="argument --max-failures"):
            dispatch("train start --steps 5 --max-failures 0")
        with pytest.raises(ValueError, match="this session has none recorded"):
            training.start(5, max_failures=1)
        assert sess.runs.current is run_before and [s["state"] for s in training.status()] == ["none", "none"]
    finally:
        sess.setup.recipe, sess.setup.given = kept
