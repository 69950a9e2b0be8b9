"""One rank set over two hosts: this one, and a network namespace with its own host name,
address and sshd (started by the fixture), reached over a veth pair and real ssh."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from checkpoint_cells import CLEAN, build_cell
from conftest import alive as _alive
from conftest import clean_trainer

from workbench.notebook.cluster import RankDied, RankFailure, RankSet

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROFILE = ROOT / ".state" / "test" / "ssh-profile"


@pytest.fixture(scope="module")
def ssh_ranks(second_host):
    rs = RankSet.start(
        n=4,
        backend="gloo",
        threads=1,
        launcher="ssh",
        profile_dir=str(PROFILE),
        hosts=f"localhost:2,root@{second_host.addr}:2",
        ssh_config=str(second_host.ssh_config),
        sys_path=(str(ROOT / "tests"),),
    )
    yield rs
    rs.stop()


def test_ranks_span_both_hosts_and_all_reduce_over_the_veth(second_host, ssh_ranks):
    rs = ssh_ranks
    here = os.uname().nodename
    assert [d["host"] for d in rs.info] == [here, here, second_host.hostname, second_host.hostname]
    assert rs.listen_ip == second_host.addr_here  # the address toward the other host: not 0.0.0.0, not loopback
    controller = psutil.Process(rs._controller_pids()[0])
    listening = {c.laddr.ip for c in controller.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert listening == {second_host.addr_here}

    def where():
        import os

        import torch
        import torch.distributed as dist

        t = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        return os.environ["MASTER_ADDR"], os.environ.get("GLOO_SOCKET_IFNAME"), t.item()

    got = rs.apply(where, timeout=120)
    assert [g[0] for g in got] == [second_host.addr_here] * 4  # rank 0's reachable address
    assert [g[1] for g in got] == [second_host.veth_here] * 2 + [second_host.veth_there] * 2
    assert [g[2] for g in got] == [10.0] * 4


def test_stream_from_the_other_host_and_a_forged_event_is_dropped_and_counted(second_host, ssh_ranks):
    from workbench.notebook import stream

    rs = ssh_ranks
    collector = stream.attach(rs)
    assert collector.address.startswith(f"tcp://{second_host.addr_here}:")

    def say(text):
        from workbench.engine import publisher, runtime
        from workbench.shared import events

        publisher.emit(events.log_event(run="hello", rank=runtime.context().rank, text=text))
        return publisher.flush(10)

    assert rs.apply(say, "signed", ranks=[3]) == [True]
    assert collector.store.wait(lambda s: any(e.get("text") == "signed" for e in s.logs), timeout=20)
    # a sender on the other host without the key: two forged messages (unsigned, wrong key)
    forge = textwrap.dedent(f"""
        import hashlib, hmac, time, zmq
        from workbench.shared import events
        data = events.encode([events.log_event(run="hello", rank=3, text="forged")])
        s = zmq.Context().socket(zmq.PUSH)
        s.connect({collector.address!r})
        s.send(data)
        s.send_multipart([hmac.new(b"not the key", data, hashlib.sha256).digest(), data])
        time.sleep(1)
        s.close(linger=2000)
    """)
    r = subprocess.run(
        ["ip", "netns", "exec", second_host.netns, sys.executable, "-c", forge],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert collector.store.wait(lambda s: collector.rejected >= 2, timeout=20)
    assert collector.rejected == 2
    assert not any(e.get("text") == "forged" for e in collector.store.logs)


def test_breakpoint_on_the_other_host_opens_pdb_here_over_the_signed_debug_link(
    second_host, ssh_ranks, monkeypatch, capsys
):
    from workbench.engine import rank_debug
    from workbench.notebook.cluster import debugging
    from workbench.notebook.cluster.cell import run_cell
    from workbench.notebook.debugger import hub

    rs = ssh_ranks
    answers = iter(["p where", "c", "p z", "q"])
    prompts = []
    monkeypatch.setattr("builtins.input", lambda prompt="": (prompts.append(prompt), next(answers))[1])
    code = (
        "import socket\nfrom workbench import engine\nwhere = socket.gethostname()\n"
        "if engine.rank == 3:\n    breakpoint()\nprint('after', where)"
    )
    run_cell(rs, code, ranks=[2, 3])
    out = capsys.readouterr().out
    assert prompts == ["(Pdb rank 3) "] * 2
    assert "[rank 3] stopped in pdb" in out
    assert f"[rank 3] '{second_host.hostname}'" in out  # `p where`, answered by the rank there
    assert f"[rank 3] after {second_host.hostname}" in out
    link = hub.existing(rs).link
    assert link.address.startswith(f"tcp://{second_host.addr_here}:")  # the veth's address, never 0.0.0.0

    # post-mortem (what `%distrain debug` does) on the other host, over the same link
    with pytest.raises(RankFailure, match=r"the cell failed on rank\(s\) 3"):
        run_cell(rs, "z = 4\n1 / 0", ranks=[3])
    capsys.readouterr()
    call = rs.submit(rank_debug.post_mortem, link, ranks=[3])
    assert debugging.attach(rs, 3, timeout=60)
    assert call.result(timeout=30) == ["ok"]
    out = capsys.readouterr().out
    assert "[rank 3] post-mortem: ZeroDivisionError: division by zero" in out and "[rank 3] 4" in out

    # a sender on the other host without the key: dropped and counted, never answered
    forge = textwrap.dedent(f"""
        import json, time, zmq
        s = zmq.Context().socket(zmq.DEALER)
        s.connect({link.address!r})
        body = json.dumps({{"op": "stopped", "rank": 3, "sid": {link.sid!r}, "lid": "x", "seq": 1}}).encode()
        s.send_multipart([b"not a mac", body])
        time.sleep(1)
        s.close(linger=2000)
    """)
    before = hub.existing(rs).rejected
    r = subprocess.run(
        ["ip", "netns", "exec", second_host.netns, sys.executable, "-c", forge],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 20
    while hub.existing(rs).rejected == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hub.existing(rs).rejected == before + 1


def test_checkpoint_folder_not_shared_by_every_host_is_refused_at_save(second_host, ssh_ranks, tmp_path):
    from workbench.notebook import checkpoints as ckpt
    from workbench.notebook.cluster.shared_dir import NotShared, require

    require(ssh_ranks, str(tmp_path / "shared"))  # one file system seen by both hosts: accepted
    assert list((tmp_path / "shared").iterdir()) == []  # the probe files are gone
    host = second_host.hostname
    with pytest.raises(
        NotShared,
        match=rf"not shared by every host: rank 2 \(host {host}\) does not see rank 0's file there; "
        rf"rank 3 \(host {host}\) does not see",
    ):
        ckpt.save(root=str(second_host.private / "ckpt"), rankset=ssh_ranks)


def _transport():
    from workbench.engine import trainer

    return trainer.current()._agreement.transport


def test_trainer_pause_asked_on_the_other_host_holds_every_rank_at_one_step(second_host, ssh_ranks):
    from workbench.engine import control
    from workbench.notebook import stream, training
    from workbench.notebook.metrics import metrics

    rs = ssh_ranks
    store = stream.attach(rs).store
    try:
        training.setup("ddp", rankset=rs)
        # shared memory is per host (the other host has its own /dev/shm): the ranks agree through gloo
        assert rs.apply(_transport) == ["gloo"] * 4
        run = training.start(100_000, rankset=rs)
        training.wait(step=3, rankset=rs, timeout=120)
        rs.apply(control.request, "pause", "asked on the other host", ranks=[3])  # rank 3 alone asks
        assert training.wait("paused", rankset=rs, timeout=60) == {r: "paused" for r in range(4)}
        held = store.run_state(run)
        step = held[0]["step"]
        assert [held[r]["step"] for r in range(4)] == [step] * 4
        time.sleep(0.6)
        status = training.status(rankset=rs)
        assert [s["step"] for s in status] == [step] * 4 and {s["state"] for s in status} == {"paused"}
        rs.apply(control.request, "resume", ranks=[3])  # and its resume alone resumes everyone
        training.wait(step=step + 3, rankset=rs, timeout=120)
        training.stop(rankset=rs)
        assert training.wait(rankset=rs, timeout=60) == {r: "stopped" for r in range(4)}
        last = store.last_steps(run)
        assert len(set(last.values())) == 1 and last[0] > step + 2
        loss = metrics(run, store=store)
        loss = loss[loss.metric == "loss"]
        for r in range(4):
            assert sorted(loss[loss["rank"] == r].step) == list(range(1, last[0] + 1))
    finally:
        rs.apply(clean_trainer, timeout=60)


def test_checkpoint_saved_by_ranks_on_both_hosts_restores_onto_two_local_ranks(ssh_ranks, ranks2, tmp_path):
    from workbench.notebook import checkpoints as ckpt

    rs = ssh_ranks
    try:
        rs.execute(build_cell("fsdp2"), timeout=180)  # each rank holds a quarter: two on each host
        rs.execute("_ck_train(3)", timeout=180)
        info = ckpt.save(root=str(tmp_path), rankset=rs)
        assert (info["name"], info["step"]) == ("step-00000003", 3)
        rs.execute("_ck_saved = _ck_digest()", timeout=120)
        saved = rs.pull("_ck_saved")[0]
        rs.execute("_ck_train(2)", timeout=180)
        ref = rs.pull("_ck_losses")[0]
        ranks2.execute(build_cell("ddp"), timeout=180)
        loaded = ckpt.load("latest", root=str(tmp_path), rankset=ranks2)
        assert (loaded["from_strategy"], loaded["from_world_size"], loaded["world_size"]) == ("fsdp2", 4, 2)
        assert ranks2.pull("_ck_state.step") == [3, 3]
        ranks2.execute("_ck_got = _ck_digest()", timeout=120)
        assert ranks2.pull("_ck_got") == [saved, saved]  # every parameter, bit for bit
        ranks2.execute("_ck_train(2)", timeout=180)
        got = ranks2.pull("_ck_losses")[0]
        assert sorted(got) == [3, 4]
        for s in (3, 4):  # step 3: the restored weights; step 4: also the restored AdamW state
            assert abs(got[s] - ref[s]) <= 1e-5 * max(abs(ref[s]), 1e-12), (s, got[s], ref[s])
    finally:
        rs.execute(CLEAN, timeout=60)
        ranks2.execute(CLEAN, timeout=60)


def test_sigkill_on_the_other_host_is_named_with_host_and_exit_within_2s(second_host, ssh_ranks, monkeypatch):
    rs = ssh_ranks
    victim = rs.procs[3]
    assert not victim.local and victim.host == second_host.hostname
    # the guard's report (with the exit status) comes over its own connection, and may arrive
    # after the engine's nanny has told the controller, which then drops the engine: here it
    # arrives 0.5 s later, as over a slower link; the death is still named with its status
    report = rs.lifeline.on_exit
    monkeypatch.setattr(rs.lifeline, "on_exit", lambda *a: (time.sleep(0.5), report(*a)))
    t0 = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)  # the namespace shares this pid space: the rank on "hostb"
    dead = []
    while not dead and time.monotonic() - t0 < 2.0:
        dead = [d for d in rs.dead() if d["rank"] == 3]
        time.sleep(0.02)
    assert dead, f"rank 3 not reported within 2 s: {rs.dead()}"
    assert dead[0]["host"] == second_host.hostname and dead[0]["exit"] == "killed by SIGKILL"
    with pytest.raises(RankDied, match=rf"rank 3 \(host {second_host.hostname}, pid {victim.pid}\) killed by SIGKILL"):
        rs.apply(lambda: 1, timeout=30)


def test_stop_leaves_no_rank_on_either_host(second_host, ssh_ranks):
    rs = ssh_ranks
    pids = list(rs.started_pids) + [p.pid for p in rs.procs]
    assert rs.stop() == []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (set(second_host.pids_in_namespace()) - {second_host.proc.pid}):
        time.sleep(0.2)
    assert set(second_host.pids_in_namespace()) == {second_host.proc.pid}  # sshd alone
    assert _alive(pids) == []


NOTEBOOK = """
import json, sys
from workbench.notebook.cluster import RankSet
rs = RankSet.start(n=2, backend="gloo", threads=1, launcher="ssh", profile_dir=sys.argv[1],
                   hosts=sys.argv[2], ssh_config=sys.argv[3], progress=lambda line: None)
print(json.dumps({"ranks": [p.pid for p in rs.procs], "controller": rs._controller_pids()}), flush=True)
import time
time.sleep(600)
"""


def _ours_over_there(second_host, ranks: list[int], before: set[int]) -> set[int]:
    """The processes in the second host's namespace that carry one of ``ranks``: the rank, the
    ssh session and shell above it, what it started. Others there are not the test's to count:
    sshd, and the module's rank set (where a selection left out the test that stops it) with
    the ``ssh host python`` polls its launcher keeps making."""
    there = set(second_host.pids_in_namespace()) - before
    ours = set()
    for pid in ranks:
        try:
            rank = psutil.Process(pid)
            line = [rank, *rank.parents(), *rank.children(recursive=True)]
        except psutil.Error:
            continue
        ours |= {p.pid for p in line if p.pid in there}
    return ours


def test_notebook_killed_leaves_no_rank_on_either_host(second_host):
    before = set(second_host.pids_in_namespace())
    nb = subprocess.Popen(
        [
            sys.executable,
            "-c",
            NOTEBOOK,
            str(PROFILE),
            f"localhost:1,root@{second_host.addr}:1",
            str(second_host.ssh_config),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        started = json.loads(nb.stdout.readline())
    except ValueError:
        nb.kill()
        raise
    pids = started["ranks"] + started["controller"]
    over_there = _ours_over_there(second_host, started["ranks"], before)
    assert set(started["ranks"]) & over_there, over_there  # a rank runs over there
    nb.kill()  # SIGKILL: no clean-up runs in the notebook process
    nb.wait(10)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _alive([*pids, *over_there]):
        time.sleep(0.2)
    assert _alive(pids) == []
    assert _alive(over_there) == []  # nor the ssh session or shell that carried the rank


def test_loopback_is_refused_when_a_rank_is_remote(second_host):
    from workbench.notebook import api
    from workbench.notebook.commands import UsageError, dispatch

    before = [(n, s.rankset) for n, s in api.sessions().items()]
    there = set(second_host.pids_in_namespace())
    line = (
        f"start --launcher ssh --hosts localhost:1,root@{second_host.addr}:1 "
        f"--ssh-config {second_host.ssh_config} --ip 127.0.0.1"
    )
    with pytest.raises(
        UsageError, match=rf"--ip 127.0.0.1 is loopback, which ranks on {second_host.addr} cannot reach"
    ):
        dispatch(line)
    assert [(n, s.rankset) for n, s in api.sessions().items()] == before
    assert set(second_host.pids_in_namespace()) == there  # nothing started over there
