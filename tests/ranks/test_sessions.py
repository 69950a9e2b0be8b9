"""Several named rank sets in one kernel, through a real IPython shell and real ranks: each
with its own stream, dashboard and checkpoints; a cell on one without switching; one
stopped while the other trains; and the refusals that name what exists."""

import os

import pytest

import workbench
from workbench.notebook import api, session, training
from workbench.notebook.cluster import AlreadyRunning
from workbench.notebook.commands import dispatch
from workbench.notebook.session import UnknownSession
from workbench.shared.checkpoint import catalog


@pytest.fixture
def shell(fresh_ranks, tmp_path):
    """A real IPython shell with ``%load_ext workbench``; no current set (fresh_ranks put the
    shared ones aside and stops what the test starts); checkpoints under tmp_path."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "workbench")
    before = catalog.default_dir()
    catalog.set_default_dir(str(tmp_path / "checkpoints"))
    yield ip
    catalog.set_default_dir(before)


def magic(ip, line):
    r = ip.run_cell(line)
    assert r.success, r.error_in_exec or r.error_before_exec
    return r.result


def test_two_named_sets_train_side_by_side_and_one_stops_while_the_other_trains(shell, fresh_ranks):
    magic(shell, "%distrain start -n 2 --session ddp --backend gloo --threads 1")
    magic(shell, "%distrain start -n 2 --session fsdp --backend gloo --threads 1")
    ddp, fsdp = workbench.session("ddp"), workbench.session("fsdp")
    fresh_ranks.started.extend([ddp.rankset, fsdp.rankset])
    assert list(workbench.sessions()) == ["ddp", "fsdp"] and session.current() is fsdp  # the newest is current
    assert ddp.rankset is not fsdp.rankset and all(s.running for s in (ddp, fsdp))

    # refusals name what exists; nothing changes
    with pytest.raises(AlreadyRunning, match="a rank set named 'ddp' is already running"):
        dispatch("start -n 2 --session ddp --backend gloo")
    with pytest.raises(UnknownSession, match="no rank set named 'nope'; the sessions are: ddp, fsdp"):
        dispatch("use --session nope")
    assert session.current() is fsdp and list(workbench.sessions()) == ["ddp", "fsdp"]

    # a cell on a named set without switching to it
    magic(shell, "%%distrain --session ddp\nfrom workbench import engine\nwhere = 'ddp' + str(engine.rank)")
    assert ddp.rankset.pull("where") == ["ddp0", "ddp1"] and session.current() is fsdp
    magic(shell, "%%distrain\nwhere = 'fsdp'")
    assert fsdp.rankset.pull("where") == ["fsdp", "fsdp"] and ddp.rankset.pull("where") == ["ddp0", "ddp1"]

    # a rank imports no notebook module, even after cells, training and checkpoints below
    magic(shell, "%distrain use --session ddp")
    assert session.current() is ddp
    magic(shell, "%distrain train start --steps 12 --gpt tiny --strategy ddp --no-dashboard")
    magic(shell, "%distrain use --session fsdp")
    magic(shell, "%distrain train start --steps 12 --gpt tiny --strategy fsdp2 --no-dashboard")
    assert training.wait(rankset=ddp.rankset, timeout=120) == {0: "finished", 1: "finished"}
    assert training.wait(rankset=fsdp.rankset, timeout=120) == {0: "finished", 1: "finished"}
    assert ddp.store is not fsdp.store and ddp.store.latest_run() != fsdp.store.latest_run()

    # metrics across sessions, and one plot of both runs
    frame = workbench.metrics(session="all")
    assert set(frame["session"]) == {"ddp", "fsdp"}
    assert frame[frame["session"] == "ddp"]["run"].unique().tolist() == [ddp.store.latest_run()]
    fig = workbench.compare("ddp", "fsdp")
    assert [t.name for t in fig.data] == ["ddp", "fsdp"]
    assert all(list(t.x) == list(range(1, 13)) for t in fig.data)
    loss_ddp = frame[(frame["session"] == "ddp") & (frame["metric"] == "loss")].groupby("step")["value"].mean()
    assert list(fig.data[0].y) == pytest.approx(list(loss_ddp))

    # each session its own checkpoints folder and dashboard
    magic(shell, "%distrain ckpt save")  # fsdp is current
    magic(shell, "%distrain ckpt save --session ddp")  # ddp for this line only
    assert session.current() is fsdp
    magic(shell, "%distrain use --session ddp")
    assert [m.step for _, m in catalog.entries(ddp.checkpoint_dir)] == [12]
    assert [m.step for _, m in catalog.entries(fsdp.checkpoint_dir)] == [12]
    assert os.path.basename(ddp.checkpoint_dir) == "ddp" and ddp.checkpoint_dir != fsdp.checkpoint_dir
    d1 = workbench.dashboard(ddp.rankset, show=False)
    d2 = workbench.dashboard(fsdp.rankset, show=False)
    assert d1 is ddp.dashboard.live and d2 is fsdp.dashboard.live and d1.store is ddp.store and d2.store is fsdp.store
    for rs in (ddp.rankset, fsdp.rankset):
        rs.execute("import sys\n_nb = sorted(m for m in sys.modules if m.startswith('workbench.notebook'))")
        assert rs.pull("_nb") == [[], []]

    # stop ddp while fsdp trains: fsdp keeps training and its stream keeps flowing
    training.start(100_000, rankset=fsdp.rankset)
    training.start(100_000, rankset=ddp.rankset)
    # one live dashboard of both sessions: a loss line per session, named by it, redrawn as they train
    magic(shell, "%distrain dashboard --session ddp,fsdp")
    over = workbench.dashboard(session=["ddp", "fsdp"], show=False)
    assert session.KERNEL.overlays[("ddp", "fsdp")] is over  # the one the magic showed
    assert [t.name for t in over.panel("loss")] == ["ddp", "fsdp"]

    def drawn(name):
        return next(t for t in over.panel("loss") if t.name == name)

    def last_step(name):
        xs = drawn(name).x
        return max(xs) if xs is not None and len(xs) else 0

    assert wait_until(lambda: last_step("ddp") >= 14 and last_step("fsdp") >= 14, 60), "the overlay did not follow"
    names = {t.name for t in over.panel("throughput")}
    assert names == {"ddp rank 0", "ddp rank 1", "fsdp rank 0", "fsdp rank 1"}
    assert "ddp" in over.status.value and "fsdp" in over.status.value
    training.wait(step=14, rankset=fsdp.rankset, timeout=60)
    magic(shell, "%distrain stop --session ddp")
    assert not ddp.running and fsdp.running and session.current() is ddp
    received = fsdp.store.received
    assert fsdp.store.wait(lambda s: s.received >= received + 20, 60), "fsdp's stream stopped flowing"
    # ddp's line stays as it ended (its store's mean loss); fsdp's goes on being drawn
    run = ddp.store.latest_run()
    xs, ys = ddp.store.arrays(run, "loss", ddp.store.ranks(run)[0])
    over.refresh()
    assert list(drawn("ddp").x) == list(xs) and list(drawn("ddp").y) == pytest.approx(list(ys))
    at = last_step("fsdp")
    assert wait_until(lambda: last_step("fsdp") > at, 60), "the overlay stopped following fsdp"
    assert "(ranks stopped)" in over.status.value.split("<br>")[0] and not over.closed
    assert [s["state"] for s in training.status(rankset=fsdp.rankset)] == ["running", "running"]
    with pytest.raises(Exception, match="the rank set 'ddp' is not running.*running: fsdp"):
        api.current()
    magic(shell, "%distrain use --session fsdp")
    training.stop()
    assert training.wait(timeout=60) == {0: "stopped", 1: "stopped"}
    d1.close()
    d2.close()
    over.close()


def wait_until(predicate, timeout: float) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())
