"""``train start --fault-tolerant``: survivors keep training while a lost replica is replaced (torchft).

4 gloo ranks as 2 torchft replica groups of 2. Rank 2 (replica 1) is SIGKILLed mid-run; the
other replica waits the quorum timeout once (its longest gap between steps, measured from the
kill) and then steps on alone while the workbench replaces replica 1's ranks from the spare on
the same controller (the replacement's time is bounded); they heal from a live peer over
torchft's checkpoint transport and rejoin, and at the end every rank holds the same weights.
The quorum timeout (2 s) is shorter than a replacement takes, so the survivors step alone for a
while by themselves: nothing holds the replacement back. A fresh rank set: ranks are killed and
replaced.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from workbench.notebook import api, metrics, registry, training
from workbench.notebook.cluster import lighthouse

pytestmark = pytest.mark.skipif(lighthouse.binary() is None, reason="torchft (the ft extra) is not installed")

# shorter than a replacement takes (4-7 s from the spare): the survivors step alone meanwhile
QUORUM_TIMEOUT = 2.0
# the survivors' longest wait: the quorum timeout, and at most this much more (measured: 0.03-0.14 s
# more, docs/unattended.md)
GAP_SLACK = 0.5
# ... and at least this much less: the lighthouse's wait begins at the first request of the quorum,
# which can come before rank 0's step is stamped (1.97 s seen once, the machine loaded by a spare's imports)
GAP_EARLY = 0.1
# a replacement's time from the spare: new processes forked, registered, connected and started on the
# run (measured 3.4-10.2 s on the 2-core machine under other runs' load, docs/unattended.md)
RESTART_MAX = 12.0
# enough steps left after the kill for the survivors to be stepping alone still when replica 1 is back
STEPS = 800
KILL_AT = 30


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def _alone_then_back(frame, rec) -> tuple[list[int], list[int]]:
    """Rank 0's steps taken with a quorum of 1 and the quorum of each step, in step order."""
    q = frame[(frame["metric"] == "quorum") & (frame["rank"] == 0)].sort_values("step")
    alone = q[q["value"] == 1]["step"].astype(int).tolist()
    return alone, [int(v) for v in q["value"].tolist()]


def _gap_at_the_failure(frame, killed_at: float, last_step: int) -> tuple[float, float]:
    """The survivors' longest wait between two steps (rank 0's step rows; the last step is left out:
    had the replacement taken longer than the steps left, it waits for it), and when it began
    against the kill (seconds; negative: before it)."""
    rows = frame[(frame["metric"] == "loss") & (frame["rank"] == 0) & (frame["step"] < last_step)].sort_values("step")
    times = rows["time"].tolist()
    gaps = [b - a for a, b in zip(times, times[1:])]
    longest = max(gaps)
    return longest, times[gaps.index(longest)] - killed_at


def test_survivors_keep_stepping_and_the_lost_replica_heals_from_a_peer(fresh_ranks, ipshell, capsys):
    from workbench.engine import fault_tolerant

    rs = fresh_ranks(4)
    pids = [p.pid for p in rs.procs]
    ipshell.run_line_magic(
        "distrain",
        f"train start --fault-tolerant --replicas 2 --quorum-timeout {QUORUM_TIMEOUT:g} --steps {STEPS} --no-dashboard",
    )
    sess = api.session()
    ft = sess.runs.current
    store = sess.store
    lh_pid = rs.lighthouse.pid
    spare = rs.spare.pid  # started with the run; its imports go on while the ranks build and step
    _wait_for(lambda: store.last_steps(ft.run).get(0, 0) >= KILL_AT, 120, "the run did not reach the kill step")
    rs.signal_rank(2, signal.SIGKILL)
    killed_at = time.time()
    states = training.wait(timeout=600)  # nobody types meanwhile
    if states != dict.fromkeys(range(4), "finished"):
        pytest.fail(f"{states}\n{ft.status_text()}", pytrace=False)
    assert ft.state == "finished"

    # the replaced replica: new processes in ranks 2 and 3; replica 0 untouched
    new = [p.pid for p in rs.procs]
    assert new[:2] == pids[:2] and new[2] != pids[2] and new[3] != pids[3], (pids, new)
    assert [f.pid for f in rs.replacements] == [spare] and rs.spare is None
    entry = registry.read(registry.entry_id_of(rs))  # what the Lab's sidebar lists
    assert [r["pid"] for r in entry["ranks"]] == new and not entry["deaths"], entry
    (rec,) = ft.records
    assert (rec["replica"], rec["rank"], rec["ranks"], rec["detail"]) == (1, 2, [2, 3], "killed by SIGKILL"), rec
    assert rec["checkpoint_step"] is not None and rec["checkpoint_step"] > rec["failed_step"] >= KILL_AT, rec
    status = {s["rank"]: s for s in rs.apply(fault_tolerant.status)}
    # replica 1's new ranks healed from a live peer (torchft's checkpoint transport) at the step the
    # survivors were at; the survivors never healed
    assert status[2]["heals"] == status[3]["heals"] == [rec["checkpoint_step"] - 1], status
    assert status[0]["heals"] == status[1]["heals"] == [], status
    assert all(status[r]["step"] == STEPS for r in range(4)), status

    frame = metrics.metrics()
    loss = frame[frame["metric"] == "loss"]
    for rank in (0, 1):  # the survivors: every step once, none skipped
        assert loss[loss["rank"] == rank]["step"].tolist() == list(range(1, STEPS + 1))
    for rank in (2, 3):  # the replacement: from the step it healed at to the end
        steps = loss[loss["rank"] == rank]["step"].tolist()
        assert steps[-1] == STEPS and rec["checkpoint_step"] in steps
    # the survivors' longest wait between two steps: the lighthouse's timeout for the silent replica,
    # begun at the kill (the step in flight then is the last before it)
    longest, began = _gap_at_the_failure(frame, killed_at, STEPS)
    alone, quorum = _alone_then_back(frame, rec)
    with capsys.disabled():
        print(
            f"\nlongest gap on rank 0: {longest:.2f} s, begun {began:+.2f} s from the kill; quorum timeout "
            f"{QUORUM_TIMEOUT:g} s; replica 1 restarted in {rec['restart_s']:.1f} s (from the spare), rejoined at "
            f"step {rec['checkpoint_step']}, {rec['rejoined_s']:.1f} s after the kill; {len(alone)} steps alone"
        )
    assert QUORUM_TIMEOUT - GAP_EARLY <= longest <= QUORUM_TIMEOUT + GAP_SLACK, longest
    assert -1.0 <= began <= 0.5, began  # the gap is the failure's, not a stall before or after it
    # a replacement from the spare (forked from it, registered, connected, started on the run) is quick
    assert rec["restart_s"] <= RESTART_MAX, rec
    # the quorum each step was taken with: 2, then 1 while replica 1 was away (the survivors stepped on
    # alone, from the failure until it rejoined, the step it healed in included), then 2 again
    assert [v for i, v in enumerate(quorum) if i == 0 or v != quorum[i - 1]] == [2, 1, 2], quorum
    assert alone == list(range(alone[0], rec["checkpoint_step"] + 1)) and len(alone) >= 2, (alone, rec)
    assert rec["failed_step"] <= alone[0] <= rec["failed_step"] + 2, (alone[:3], rec)

    digests = rs.apply(fault_tolerant.weights_digest)
    assert len({d["digest"] for d in digests}) == 1 and {d["step"] for d in digests} == {STEPS}, digests

    capsys.readouterr()
    ipshell.run_line_magic("distrain", "train status")
    out = capsys.readouterr().out
    assert f"fault-tolerant run {ft.run}: finished; 2 replica groups x 2 ranks, quorum 2 of 2 at step {STEPS}" in out
    assert "replacement 1: replica 1 lost rank 2 (host " in out and "killed by SIGKILL" in out, out
    assert "ranks 2-3 restarted in" in out and "healed from a live peer and rejoined at step" in out, out
    from workbench.notebook.dashboard import dashboard

    dash = dashboard(rs, show=False)
    try:
        line = dash.status_line(ft.run)
        assert "quorum 2" in line and "replacement 1: replica 1" in line, line
    finally:
        dash.close()
    api.stop()
    _wait_for(lambda: not os.path.exists(f"/proc/{lh_pid}"), 10, "the lighthouse outlived its rank set")


def test_a_run_does_not_end_without_the_replica_being_replaced(fresh_ranks, ipshell, capsys):
    """Fewer steps left than the replacement takes: the survivors' last step waits for a quorum of every
    replica, so the replacement (healed in it) takes it with them; the run ends whole, with the same weights everywhere.
    Then a second run on the same ranks (replaced ones included), stopped from the notebook; then a third,
    whose rank 2 dies once every replica took the last step (``_a_rank_lost_after_the_last_step_is_not_replaced``)."""
    from workbench.engine import fault_tolerant
    from workbench.notebook.commands import UsageError

    rs = fresh_ranks(4)
    # killed 40 steps before the end, with a 1 s quorum timeout: the survivors are at their last step
    # seconds before new ranks can be (a process start, torch's import, the model, the Manager). Not
    # fewer: a step takes ~15 ms here and the store sees a step up to ~0.15 s late (the ranks' send
    # window, this test's poll), so with 5 left the run could end before the kill
    steps = KILL_AT + 40
    ft = training.fault_tolerant(steps, replicas=2, quorum_timeout=1.0)
    store = api.session().store
    with pytest.raises(
        UsageError, match=r"the fault-tolerant run .* takes `train stop`, `train status` and `train wait`"
    ):
        ipshell.run_line_magic("distrain", "train pause")
    _wait_for(lambda: store.last_steps(ft.run).get(0, 0) >= KILL_AT, 120, "the run did not reach the kill step")
    rs.signal_rank(2, signal.SIGKILL)
    states = training.wait(timeout=600)
    if states != dict.fromkeys(range(4), "finished"):
        pytest.fail(f"{states}\n{ft.status_text()}", pytrace=False)
    (rec,) = ft.records
    status = {s["rank"]: s for s in rs.apply(fault_tolerant.status)}
    assert rec["checkpoint_step"] == steps and status[2]["heals"] == status[3]["heals"] == [steps - 1], status
    # the survivors' last step waited seconds for the replacement, re-forming the quorum (and the replicas'
    # gloo group) once it asked the lighthouse to join, not every 0.1 s meanwhile
    assert status[0]["wait_s"] > 1.0 and status[0]["wait_rounds"] <= 4, status[0]
    digests = rs.apply(fault_tolerant.weights_digest)
    assert len({d["digest"] for d in digests}) == 1 and {d["step"] for d in digests} == {steps}, digests
    frame = metrics.metrics()
    rows = frame[(frame["metric"] == "loss") & (frame["rank"] == 0)].sort_values("step")
    assert rows["step"].tolist() == list(range(1, steps + 1))
    back = rec["time"] + rec["restart_s"]  # about when the replacement was started on the run
    before_last, last = rows["time"].iloc[-2], rows["time"].iloc[-1]
    assert before_last < back - 0.5 < last, (before_last - rec["time"], last - rec["time"], rec)  # it waited

    first_lighthouse = rs.lighthouse.pid
    ipshell.run_line_magic("distrain", "train start --fault-tolerant --steps 100000 --no-dashboard")
    again = api.session().runs.current
    assert again.run != ft.run and rs.lighthouse.pid != first_lighthouse
    assert (
        not os.path.exists(f"/proc/{first_lighthouse}")
        or open(f"/proc/{first_lighthouse}/stat").read().split()[2] == "Z"
    )
    _wait_for(lambda: min(store.last_steps(again.run).values() or [0]) >= 5, 120, "the second run did not step")
    assert len(store.last_steps(again.run)) == 4
    ipshell.run_line_magic("distrain", "train stop")
    states = training.wait(timeout=120)
    assert states == dict.fromkeys(range(4), "stopped"), again.status_text()
    # a third run on these ranks (no rank set of its own: starting one costs more than the run)
    _a_rank_lost_after_the_last_step_is_not_replaced(rs, ipshell, capsys)


def _die_as_the_run_ends() -> None:
    """On a rank: SIGKILL this process at the end of its run, once it took the last step and sent its step
    rows, before it ends its Manager and says it finished (what the notebook hears last). The rows were
    handed to the rank's sockets, whose I/O thread sends them a moment later: half a second for that, as a
    rank that dies while ending its Manager has had, or the notebook never hears of its last step."""
    from workbench.engine import fault_tolerant

    def die(self):
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    fault_tolerant.FaultTolerantRun._end_manager = die


def _die_at_the_last_step() -> None:
    """On a rank: SIGKILL this process as its run starts the last step (the others then wait for its replica)."""
    from workbench.engine import fault_tolerant

    step = fault_tolerant.FaultTolerantRun._one_step

    def one_step(self):
        if self.manager.current_step() == self.target - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return step(self)

    fault_tolerant.FaultTolerantRun._one_step = one_step


def _heartbeating(rs) -> int:
    """How many replicas the lighthouse hears (its status page)."""
    import re
    import urllib.request

    page = urllib.request.urlopen(rs.lighthouse.address + "/status", timeout=5).read().decode()
    return int(re.search(r"\]\[(\d+) heartbeating\]", page).group(1))


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _a_rank_lost_after_the_last_step_is_not_replaced(rs, ipshell, capsys) -> None:
    """Every replica took the last step, then rank 2 dies before it says it finished: the run is over, so
    the workbench records a death after the end instead of replacing replica 1 (a replacement would find
    no run to join), and the run ends finished. The survivors' Managers end with their run: the lighthouse
    hears no replica after it (else it would wait for them with any later joiner)."""
    from workbench.engine import fault_tolerant

    pids = [p.pid for p in rs.procs]
    replaced = len(rs.replacements)
    steps = 40
    rs.apply(_die_as_the_run_ends, ranks=[2])
    ft = training.fault_tolerant(steps, replicas=2, quorum_timeout=1.0)
    states = training.wait(timeout=300)
    assert states == dict.fromkeys(range(4), "finished"), ft.status_text()
    assert ft.wait(10) and ft.state == "finished", ft.status_text()
    (rec,) = ft.after_end
    assert (rec["replica"], rec["rank"], rec["detail"], rec["failed_step"]) == (1, 2, "killed by SIGKILL", steps)
    assert ft.records == [] and len(rs.replacements) == replaced and [p.pid for p in rs.procs] == pids, ft.records
    assert not _running(pids[2]) and all(_running(p) for p in pids[:2] + pids[3:])
    assert [d["rank"] for d in rs.dead()] == [2]
    frame = metrics.metrics()
    loss = frame[(frame["run"] == ft.run) & (frame["metric"] == "loss")]
    for rank in range(4):  # every step once on every rank, the lost one's included
        assert sorted(loss[loss["rank"] == rank]["step"].tolist()) == list(range(1, steps + 1)), rank
    quorum = frame[(frame["run"] == ft.run) & (frame["metric"] == "quorum")]
    assert set(quorum["value"].tolist()) == {2}
    status = {s["rank"]: s for s in rs.apply(fault_tolerant.status, ranks=[0, 1, 3])}
    assert all(s["state"] == "finished" and s["step"] == steps for s in status.values()), status
    _wait_for(lambda: _heartbeating(rs) == 0, 10, "the lighthouse still hears a finished replica")

    capsys.readouterr()
    ipshell.run_line_magic("distrain", "train status")
    out = capsys.readouterr().out
    assert f"fault-tolerant run {ft.run}: finished; 2 replica groups x 2 ranks, quorum 2 of 2 at step {steps}" in out
    assert (
        f"replica 1 lost rank 2 (host {rec['host']}) after the run's last step ({steps}): killed by SIGKILL; "
        "not replaced, the run had taken all its steps" in out
    ), out
    lh = rs.lighthouse.pid
    api.stop()
    _wait_for(lambda: not _running(lh), 10, "the lighthouse outlived its rank set")


def test_a_failed_replacement_lets_the_others_finish_alone(fresh_ranks, ipshell, capsys):
    """Rank 1 (replica 1 of 2, one rank each) dies as it starts the last step; replica 0 waits there for
    its replacement, whose process is SIGKILLed as soon as it appears: the survivors are told to finish
    alone, take the last step with a quorum of 1, and the run ends finished, saying why replica 1 is out."""
    from workbench.engine import fault_tolerant

    rs = fresh_ranks(2)
    steps = 30
    rs.apply(_die_at_the_last_step, ranks=[1])
    ft = training.fault_tolerant(steps, replicas=2, quorum_timeout=1.0)
    os.kill(rs.spare.pid, signal.SIGKILL)  # a dead spare: the replacement starts a forking parent of its own
    rs.spare.proc.wait()
    _wait_for(lambda: rs.replacements, 120, "no replacement was started")
    fork = rs.replacements[0]
    os.kill(fork.pid, signal.SIGKILL)  # the process that would fork the new rank, as it imports torch
    states = training.wait(timeout=300)
    assert states == {0: "finished", 1: "error"}, ft.status_text()
    assert ft.wait(10) and ft.state == "finished" and list(ft.left_out) == [1], ft.status_text()
    (rec,) = ft.records
    assert (rec["replica"], rec["rank"], rec["detail"], rec["failed_step"]) == (1, 1, "killed by SIGKILL", steps - 1)
    assert rec["error"].startswith("RuntimeError: the process that starts the replacement ranks ended (exit -9)"), rec
    assert len(rs.replacements) == 1 and not _running(fork.pid)  # tried once, not again and again

    (status,) = rs.apply(fault_tolerant.status, ranks=[0])
    # it waited at the last step for replica 1 (rank 1 was lost there), then took it alone
    assert status["state"] == "finished" and status["step"] == steps and status["quorum"] == 1, status
    assert status["wait_rounds"] >= 1 and status["wait_s"] > 0, status
    frame = metrics.metrics()
    rows = frame[(frame["run"] == ft.run) & (frame["rank"] == 0)]
    assert sorted(rows[rows["metric"] == "loss"]["step"].tolist()) == list(range(1, steps + 1))
    q = rows[rows["metric"] == "quorum"].sort_values("step")["value"].tolist()
    assert q == [2] * (steps - 1) + [1], q

    capsys.readouterr()
    ipshell.run_line_magic("distrain", "train status")
    out = capsys.readouterr().out
    assert (
        f"fault-tolerant run {ft.run}: finished alone, without replica 1 (its replacement failed); "
        f"2 replica groups x 1 ranks, quorum 1 of 2 at step {steps}" in out
    ), out
    assert f"replacement 1: replica 1 lost rank 1 (host {rec['host']}) at step {steps - 1}: killed by SIGKILL" in out
    assert "the replacement failed: RuntimeError: the process that starts the replacement ranks ended (exit -9)" in out
    assert "the other replicas finished alone (replica 1 left out)" in out and "rank 1 error: replica 1 is out" in out
    api.stop()


def test_the_lighthouse_takes_another_port_when_its_port_was_taken(monkeypatch, tmp_path):
    """A free port may be taken before the lighthouse binds it (it then exits at once): the next try
    uses another, and the address given to the ranks is the one it listens on."""
    import socket

    from workbench.notebook.cluster import network

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    first = taken.getsockname()[1]
    ports = iter([first])
    real = network.free_port
    monkeypatch.setattr(network, "free_port", lambda: next(ports, None) or real())
    try:
        lh = lighthouse.Lighthouse(quorum_timeout_s=1.0, log_path=str(tmp_path / "lighthouse.log"))
    finally:
        taken.close()
    try:
        assert lh.alive() and lh.port != first
        assert "Address already in use" in lh.log()  # the first try
        with socket.create_connection(("127.0.0.1", lh.port), timeout=2):
            pass
    finally:
        assert lh.stop() == [] and not lh.alive()


def test_a_killed_notebook_leaves_no_lighthouse():
    """The lighthouse ends with the notebook process that started it, as the controller does."""
    import subprocess
    import sys

    code = (
        "import time\nfrom workbench.notebook.cluster.lighthouse import Lighthouse\n"
        "lh = Lighthouse(quorum_timeout_s=1.0)\nprint(lh.pid, flush=True)\ntime.sleep(120)\n"
    )
    notebook = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(notebook.stdout.readline())
        assert os.path.exists(f"/proc/{pid}")
    finally:
        notebook.kill()
        notebook.wait()
    _wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 10, "the lighthouse outlived its notebook process")


def test_hsdp_replicas_shard_the_model_and_a_lost_one_heals_its_shards_from_a_peer(fresh_ranks, ipshell, capsys):
    """``--strategy hsdp``: 2 replica groups (dp_replicate) x 2 ranks that shard the model (dp_shard). Rank 3
    (replica 1's second shard) is SIGKILLed; replica 0 keeps stepping, replica 1's new ranks each heal their
    own shard from the same shard of replica 0, and at the end the whole weights (gathered in each replica)
    are equal across replicas while every rank holds only its shard between steps."""
    from workbench.engine import fault_tolerant

    steps = 600  # enough left after the kill for replica 0 to be stepping alone still when replica 1 is back
    rs = fresh_ranks(4)
    capsys.readouterr()
    ipshell.run_line_magic(
        "distrain",
        f"train start --fault-tolerant --strategy hsdp --replicas 2 --quorum-timeout {QUORUM_TIMEOUT:g} "
        f"--steps {steps} --no-dashboard",
    )
    assert "2 torchft replica groups x 2 ranks (each sharded over its ranks, hsdp)" in capsys.readouterr().out
    ft = api.session().runs.current
    store = api.session().store
    _wait_for(lambda: store.last_steps(ft.run).get(0, 0) >= KILL_AT, 120, "the run did not reach the kill step")
    rs.signal_rank(3, signal.SIGKILL)
    killed_at = time.time()
    states = training.wait(timeout=600)
    if states != dict.fromkeys(range(4), "finished"):
        pytest.fail(f"{states}\n{ft.status_text()}", pytrace=False)
    (rec,) = ft.records
    assert (rec["replica"], rec["rank"], rec["ranks"]) == (1, 3, [2, 3]), rec
    assert rec["checkpoint_step"] is not None and rec["restart_s"] <= RESTART_MAX, rec

    held = {h["rank"]: h for h in rs.apply(fault_tolerant.held)}
    full = held[0]["full_param_bytes"]
    for h in held.values():  # between steps: the shard and its AdamW moments, no whole parameters
        assert h["model_param_bytes"] == 0, h
        assert h["shard_bytes"] == h["shard_numel"] * 4 and full / 2 <= h["shard_bytes"] < full / 2 + 4 * 2, h
        assert h["optim_bytes"] == 2 * h["shard_bytes"], h
    # each new rank healed its own shard (half the model), not the whole model, at the step the survivors were at
    assert held[2]["healed_numel"] == held[3]["healed_numel"] == held[2]["shard_numel"], held
    assert held[0]["healed_numel"] is None and held[1]["healed_numel"] is None, held
    status = {s["rank"]: s for s in rs.apply(fault_tolerant.status)}
    assert status[2]["heals"] == status[3]["heals"] == [rec["checkpoint_step"] - 1], status
    assert all(status[r]["step"] == steps for r in range(4)), status

    frame = metrics.metrics()
    rows = frame[(frame["metric"] == "loss") & (frame["rank"] == 0)].sort_values("step")
    assert rows["step"].tolist() == list(range(1, steps + 1))
    longest, began = _gap_at_the_failure(frame, killed_at, steps)
    alone, quorum = _alone_then_back(frame, rec)
    with capsys.disabled():
        print(
            f"\nhsdp: longest gap on rank 0: {longest:.2f} s, begun {began:+.2f} s from the kill; replica 1 "
            f"restarted in {rec['restart_s']:.1f} s, rejoined at step {rec['checkpoint_step']}, "
            f"{rec['rejoined_s']:.1f} s after the kill; {len(alone)} steps alone; "
            f"shard {held[0]['shard_bytes']} of {full} parameter bytes per rank"
        )
    assert QUORUM_TIMEOUT - GAP_EARLY <= longest <= QUORUM_TIMEOUT + GAP_SLACK and -1.0 <= began <= 0.5, (
        longest,
        began,
    )
    # replica 0 kept stepping while replica 1 was away, from the failure until replica 1 healed
    assert [v for i, v in enumerate(quorum) if i == 0 or v != quorum[i - 1]] == [2, 1, 2], quorum
    assert alone == list(range(alone[0], rec["checkpoint_step"] + 1)) and len(alone) >= 2, (alone, rec)

    digests = rs.apply(fault_tolerant.weights_digest)  # each replica gathers its shards
    assert len({d["digest"] for d in digests}) == 1 and {d["step"] for d in digests} == {steps}, digests

    # the same training as ddp's: two short runs on these ranks (replaced ones included) from the same seed,
    # one sharded, one not, take the same losses step by step

    losses = {}
    for strategy in ("hsdp", "ddp"):
        run = training.fault_tolerant(40, replicas=2, quorum_timeout=QUORUM_TIMEOUT, strategy=strategy)
        assert training.wait(timeout=300) == dict.fromkeys(range(4), "finished"), run.status_text()
        frame = metrics.metrics()
        rows = frame[(frame["run"] == run.run) & (frame["metric"] == "loss")].sort_values(["rank", "step"])
        losses[strategy] = rows["value"].to_numpy()
        assert len(losses[strategy]) == 4 * 40
    assert abs(losses["hsdp"] - losses["ddp"]).max() < 1e-4, (losses["hsdp"][-4:], losses["ddp"][-4:])
    assert losses["hsdp"][39] < losses["hsdp"][0] - 0.5  # it learns: rank 0's loss at step 40 against step 1
    api.stop()
