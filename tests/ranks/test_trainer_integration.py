"""Tier 2: trainer <-> checkpoint / memory / diagnosis integration on the shared 2-rank set.

Hook API (remove_hook, pausing), auto-save that survives ``training.setup`` and can be
switched on mid-run, a (simulated) out-of-memory that pauses the run with its report,
and the step timeout that names the rank holding a run up.
"""

import time

import pytest
from conftest import clean_trainer

from workbench.engine import trainer
from workbench.notebook import checkpoints as ck
from workbench.notebook import registry, session, stream, training
from workbench.shared.checkpoint import catalog


@pytest.fixture
def rs(ranks2):
    yield ranks2

    ranks2.apply(clean_trainer, timeout=60)
    session.of(rs).checkpoints.autosave = None


def steps_saved(root):
    return [m.step for _, m in catalog.entries(root)]


def test_remove_hook_and_pausing(rs):
    training.setup("none", rankset=rs)

    def drill():
        t = trainer.current()
        f = lambda r: None  # noqa: E731
        t.add_hook(f, every=2)
        t.add_hook(f)
        assert t.remove_hook(f) and not t.remove_hook(f) and t.hooks == []
        assert not t.pausing
        t.pause("x")
        p = t.pausing
        t.resume()
        return p, t.pausing

    assert rs.apply(drill) == [(True, False)] * 2


def test_autosave_before_setup_and_switched_on_mid_run(rs, tmp_path):
    root = str(tmp_path)
    ck.autosave(2, keep=10, async_=False, root=root, rankset=rs)  # before any trainer exists
    training.setup("ddp", rankset=rs)
    training.start(4, rankset=rs)
    assert training.wait(timeout=120, rankset=rs) == {0: "finished", 1: "finished"}
    assert steps_saved(root) == [2, 4]

    training.setup("ddp", rankset=rs)  # a new trainer: the configured auto-save follows it
    ck.autosave(None, rankset=rs)
    rs.execute(
        "import time; from workbench.engine import trainer as _t\n_t.current().add_hook(lambda r: time.sleep(0.05))",
        timeout=30,
    )
    training.start(40, rankset=rs)
    training.wait(step=3, rankset=rs, timeout=60)
    root2 = str(tmp_path / "mid")
    ck.autosave(5, keep=10, async_=False, root=root2, rankset=rs)  # mid-run: one agreed step everywhere
    training.wait(step=22, rankset=rs, timeout=120)
    ck.autosave(None, rankset=rs)
    assert training.wait(timeout=120, rankset=rs) == {0: "finished", 1: "finished"}
    saved = steps_saved(root2)
    assert saved and all(s % 5 == 0 for s in saved) and saved[-1] >= 20, saved
    assert saved == list(range(saved[0], saved[-1] + 1, 5))


def test_out_of_memory_pauses_with_breakdown_and_advice(rs):
    training.setup("ddp", rankset=rs)
    training.inject("oom", 3, rankset=rs)  # simulated: raises MemoryError in step 3 on both ranks
    run = training.start(5, rankset=rs)
    assert training.wait("paused", rankset=rs, timeout=60) == {0: "paused", 1: "paused"}
    st = stream.attach(rs).store.run_state(run)
    for r in (0, 1):
        reason = st[r]["reason"]
        assert f"out of memory on rank {r}" in reason and "simulated" in reason, reason
        assert "optimizer state" in reason and "What would help" in reason and "FSDP2" in reason
        assert st[r]["step"] == 2  # step 3 was not counted
    training.resume(rankset=rs)
    assert training.wait(timeout=60, rankset=rs) == {0: "finished", 1: "finished"}
    assert stream.attach(rs).store.last_steps(run) == {0: 5, 1: 5}


HANG = """
import threading
from workbench.engine import trainer as _t
_release = threading.Event()
def _hang_in_hook(rec):
    if rec["step"] == 3 and _t.current().rank == 1:
        _release.wait(120)
_t.current().add_hook(_hang_in_hook)
"""


def test_step_timeout_names_the_stuck_rank_and_its_frame_then_run_completes(rs, capsys):
    training.setup("ddp", rankset=rs)
    rs.execute(HANG, timeout=30)
    store = stream.attach(rs).store
    before = len(session.of(rs).hangs)
    timeout = 2.0
    try:
        run = training.start(6, step_timeout=timeout, rankset=rs)
        training.wait(step=3, rankset=rs, timeout=60)
        t_step3 = time.monotonic()  # the last step event before the hang has arrived
        deadline = t_step3 + timeout + 5
        while len(session.of(rs).hangs) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        elapsed = time.monotonic() - t_step3
        assert len(session.of(rs).hangs) > before, "no hang diagnosis within timeout + 5 s"
        assert elapsed <= timeout + 5, elapsed
        rep = session.of(rs).hangs[-1]
        assert rep["run"] == run and rep["stuck"] == [1] and rep["waiting"] == [0], rep["text"]
        assert "in _hang_in_hook" in rep["where"][1] and "in collect" in rep["where"][0], rep["where"]
        assert "agreement.py" in rep["where"][0], rep["where"]  # waiting in the ranks' agreement
        assert "[rank 1] STUCK" in rep["text"] and "_hang_in_hook" in rep["text"]
        # the first line leads with the conclusion: who waits where, and for whom
        first = rep["text"].splitlines()[0]
        assert first.startswith(f"training {run}: no step for ") and rep["conclusion"] in first, first
        assert "rank 0 waits in the trainer's step agreement" in rep["conclusion"], rep["conclusion"]
        assert "rank 1 is not in one: it is in _hang_in_hook (line 7 of a cell)" in rep["conclusion"]
        assert rep["text"] in capsys.readouterr().out
        assert any(e["text"] == rep["text"] and e["rank"] == -1 for e in store.logs)
        assert training.states(rankset=rs) == {0: "running", 1: "running"}  # nothing was stopped
    finally:
        rs.execute("_release.set()", ranks=[1], timeout=30)
    assert training.wait(timeout=60, rankset=rs) == {0: "finished", 1: "finished"}
    assert store.last_steps(run) == {0: 6, 1: 6}
    assert len([h for h in session.of(rs).hangs if h["run"] == run]) == 1  # once per stall


def test_finished_is_final_when_wait_returns(rs, tmp_path):
    """The soak's refusal ("training is already finished ...: wait for it to finish"): ``wait()``
    returned on the stream's "finished" while a rank's training thread was still ending (its
    last events, the async auto-save of the last step). Now it returns once nothing of the run
    works on any rank, so the next start, at once, is taken. A round as the soak ran, then rounds
    with a listener of the end that lingers on rank 1 (a slower end: the same window, made wide
    enough to be met every time)."""
    root = str(tmp_path)
    training.setup("ddp", rankset=rs)
    ck.autosave(5, keep=2, async_=True, root=root, rankset=rs)  # lands on each round's last step

    def threads_alive():
        t = trainer.current()
        return t._thread is not None and t._thread.is_alive()

    def linger(seconds):
        import time as _time

        from workbench.engine import listeners

        class Linger(listeners.TrainerListener):
            def state_changed(self, trainer, state, reason):
                if state == "finished":
                    _time.sleep(seconds)

        for x in listeners.listeners():
            if type(x).__name__ == "Linger":
                listeners.unsubscribe(x)
        if seconds:
            listeners.subscribe(Linger())
        return True

    entry = registry.announce(rs)  # the Lab sidebar's entry of the set: it shows the run as the contract says
    try:
        for n in range(3):
            if n == 1:
                rs.apply(linger, 0.5, ranks=[1])
            run = training.start(5, rankset=rs)  # refused where the last round's thread still ran
            assert training.wait(timeout=120, rankset=rs) == {0: "finished", 1: "finished"}
            assert rs.apply(threads_alive) == [False, False], f"round {n}: a training thread outlived wait()"
        assert training.current(rankset=rs).state == "finished"
        assert steps_saved(root)[-1] == 15  # the last round's auto-save was written before wait() returned
        shown = registry.read(entry)["run"]
        assert (shown["id"], shown["kind"], shown["state"]) == (run, "trainer", "finished"), shown
    finally:
        registry.withdraw(rs)
        rs.apply(linger, 0, ranks=[1])
