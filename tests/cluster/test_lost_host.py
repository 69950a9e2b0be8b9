"""A lost host: ranks on the network-namespace host, whose link is taken down mid-run.

Nothing ends and nothing is told when a link goes down: the guards' beats stop reaching the
notebook, and silence past ``lifeline.HOST_SILENCE_S`` names the host lost. Real sshd, real
veth, ``ip link set ... down`` inside the namespace; the link is brought up again whatever
happens. Fresh rank sets: each test loses half of its ranks.
"""

from __future__ import annotations

import pathlib
import time

import pytest
from conftest import alive as _alive
from conftest import ranks_in_loop

from workbench.notebook import api, metrics, training
from workbench.notebook import checkpoints as ck
from workbench.notebook.cluster.lifeline import HOST_SILENCE_S
from workbench.notebook.commands import dispatch
from workbench.shared.checkpoint import catalog
from workbench.shared.errors import RankDied

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROFILE = ROOT / ".state" / "test" / "lost-host-profile"

# a collective every 50 ms across both hosts until the cell is ended
ALL_REDUCE_LOOP = """
import os, time, torch, torch.distributed as dist
while True:
    t = torch.ones(1)
    dist.all_reduce(t)
    open(os.path.join({folder!r}, f"in-loop-{{dist.get_rank()}}"), "w").close()  # every rank in the loop
    time.sleep(0.05)
"""


def _two_hosts(fresh_ranks, second_host):
    return fresh_ranks(
        4,
        launcher="ssh",
        profile_dir=str(PROFILE),
        hosts=f"localhost:2,root@{second_host.addr}:2",
        ssh_config=str(second_host.ssh_config),
    )


def _named_lost(rs, host: str) -> list[dict]:
    return [d for d in rs.dead() if d.get("host_lost") and d["host"] == host]


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _alive(pids)


def test_a_lost_host_is_named_in_seconds_nothing_hangs_and_restart_uses_the_host_left(
    second_host, fresh_ranks, capsys, tmp_path
):
    rs = _two_hosts(fresh_ranks, second_host)
    host = second_host.hostname
    over_there = [p.pid for p in rs.procs if not p.local]
    assert [p.host for p in rs.procs[2:]] == [host, host] and len(over_there) == 2
    call = rs.execute_async(ALL_REDUCE_LOOP.format(folder=str(tmp_path)))
    ranks_in_loop(tmp_path, 4)  # every rank in a collective with the other host
    try:
        t0 = time.monotonic()
        down = time.time()
        second_host.set_link(False)
        with pytest.raises(RankDied) as died:  # the cell returns, naming the host
            call.result(timeout=60)
        assert time.monotonic() - t0 <= HOST_SILENCE_S + 2.0
        lost = _named_lost(rs, host)
        assert [d["rank"] for d in lost] == [2, 3], rs.dead()
        assert max(d["time"] for d in lost) - down <= HOST_SILENCE_S + 1.0, lost  # within the allowed silence
        assert f"rank 2 (host {host}, pid {over_there[0]}) lost with its host: no heartbeat from {host} for" in str(
            died.value
        )
        assert rs.lost_hosts == [host]

        capsys.readouterr()
        t1 = time.monotonic()
        frame = dispatch("status")  # asks the controller, not the stuck ranks
        assert time.monotonic() - t1 < 10
        assert frame["state"].tolist()[2:] == ["dead", "dead"]
        assert f"host {host} lost: `%distrain restart` brings the rank set back on the hosts left" in (
            capsys.readouterr().out
        )

        survivors = [p.pid for p in rs.procs if p.local]
        dispatch("restart")  # by hand: on the host left, every rank it holds
        out = capsys.readouterr().out
        assert f"2 ranks up again on localhost:2 (lost: {host})" in out, out
        new = api.current()
        assert new is not rs and new.world_size == 2 and all(p.local for p in new.procs)
        assert new.apply(lambda: 1, timeout=60) == [1, 1]
        assert _alive(survivors) == []  # stuck in a collective with the lost host: ended by pid
        # the lost host's ranks cannot hear the stop: their guards give up on the silent notebook
        assert _gone_within(over_there, 30) == [], "ranks on the lost host still running"
    finally:
        second_host.set_link(True)


def test_with_a_budget_the_run_continues_on_the_host_left_resharded(second_host, fresh_ranks, tmp_path, capsys):
    rs = _two_hosts(fresh_ranks, second_host)
    host = second_host.hostname
    training.setup("ddp", rankset=rs)
    ck.autosave(10, keep=10, async_=False, root=str(tmp_path), rankset=rs)  # step 10 on disk at step 11; all kept
    try:
        run = training.start(60, max_failures=1, rankset=rs)
        training.wait(step=13, rankset=rs, timeout=240)
        down = time.time()
        second_host.set_link(False)
        assert training.wait(timeout=400) == {0: "finished", 1: "finished"}  # nobody types
        lost = _named_lost(rs, host)
        assert [d["rank"] for d in lost] == [2, 3] and max(d["time"] for d in lost) - down <= HOST_SILENCE_S + 1.0
        sess = api.session()
        new = sess.rankset
        assert new is not rs and new.world_size == 2 and new.config.hosts == "localhost:2"
        (rec,) = sess.recoveries
        assert (rec["kind"], rec["host"], rec["world_size"], rec["from_world_size"], rec["hosts"]) == (
            "host lost",
            host,
            2,
            4,
            "localhost:2",
        ), rec
        assert rec["checkpoint_step"] >= 10 and 0 <= rec["steps_redone"] <= 10, rec
        assert rec["lost_s"] is not None and rec["lost_s"] >= rec["down_s"] > 0, rec  # caught up on 2 ranks
        saved = {c["name"]: c["world_size"] for c in catalog.list_checkpoints(str(tmp_path)).to_dict("records")}
        assert saved[rec["checkpoint"]] == 4  # saved by 4 ranks on two hosts, loaded onto 2 on one
        frame = metrics.metrics()
        loss = frame[(frame["metric"] == "loss") & (frame["run"] == run)]
        for rank in (0, 1):  # every step once on the ranks that carried on
            assert loss[loss["rank"] == rank]["step"].tolist() == list(range(1, 61))
        capsys.readouterr()
        dispatch("train status")
        out = capsys.readouterr().out
        assert f"training {run}: finished; failure budget 1/1 used, target step 60" in out, out
        assert f"failure 1: host {host} lost at step" in out and f"no heartbeat from {host}" in out, out
        assert (
            f"restarted 2 ranks (was 4) on localhost:2, loaded {rec['checkpoint']} (step {rec['checkpoint_step']})"
            in out
        ), out
    finally:
        second_host.set_link(True)
        api.session().checkpoints.autosave = None
