"""Ranks through a real Slurm (munged, slurmctld, slurmd started by the fixture).

The rank set is one sbatch job of 4 tasks on the one real node; a second node is declared
but never comes up, so a request for two nodes pends the way it would on a busy cluster.
"""

from __future__ import annotations

import _thread
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from conftest import alive as _alive

from workbench.notebook import api, registry, training  # registry: Lab entries, as `%load_ext` loads it
from workbench.notebook.cluster import Interrupted, RankDied, RankSet
from workbench.notebook.cluster.slurm import SlurmError, SlurmRequest

from .daemons import end_leftovers, processes_of

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROFILE = ROOT / ".state" / "test" / "slurm-profile"


def _job_processes(job_id: str) -> list[int]:
    """Every process on this host that belongs to the Slurm job (its environment says so)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("SLURM_JOB_ID") == job_id:
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def _jobs(cluster) -> set[str]:
    """The ids of the jobs in ``cluster``'s queue now (a test compares with those it found, as
    the module's rank set may still hold one where a selection left out the test that stops it)."""
    return {line.split()[0] for line in cluster.squeue()}


def _scontrol(job_id: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout


def _start(n: int, request: SlurmRequest, progress=lambda line: None):
    """``api.start`` of ``n`` gloo ranks through this test's Slurm with ``request``."""
    return api.start(n, launcher="slurm", backend="gloo", profile_dir=str(PROFILE), progress=progress, slurm=request)


@pytest.fixture(scope="module")
def slurm_ranks(slurm_cluster):
    lines: list[str] = []
    rs = RankSet.start(
        n=4,
        backend="gloo",
        threads=1,
        launcher="slurm",
        profile_dir=str(PROFILE),
        sys_path=(str(ROOT / "tests"),),
        progress=lines.append,
        slurm=SlurmRequest(
            time="10:00", partition="debug", account="wbtest", sbatch=("--overcommit", "--comment=workbench-test")
        ),
    )
    rs.lines = lines
    yield rs
    rs.stop()


def test_four_ranks_through_sbatch_with_every_option(slurm_cluster, slurm_ranks):
    rs = slurm_ranks
    job = rs.job_id
    assert job and any(line.startswith(f"{job} RUNNING") for line in slurm_cluster.squeue())
    info = _scontrol(job)
    # each option reached sbatch (ipyparallel's own template would have dropped them)
    for field in (
        "TimeLimit=00:10:00",
        "Comment=workbench-test",
        "NumTasks=4",
        "Partition=debug",
        "Account=wbtest",
        "OverSubscribe=OK",
    ):
        assert field in info, (field, info)
    assert rs.nodes == (slurm_cluster.host,)
    assert rs.allocation() == f"Slurm job {job} on {slurm_cluster.host}"
    assert f"job {job} running on {slurm_cluster.host}" in rs.lines

    def placement():
        import os

        import torch
        import torch.distributed as dist

        t = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        return os.environ["SLURM_JOB_ID"], os.environ["SLURM_LOCALID"], os.environ["LOCAL_RANK"], t.item()

    got = rs.apply(placement)
    assert [g[0] for g in got] == [job] * 4
    assert [g[1] for g in got] == [g[2] for g in got] == ["0", "1", "2", "3"]  # LOCAL_RANK from Slurm's task ids
    assert [g[3] for g in got] == [10.0] * 4


def test_trainer_ten_steps_with_the_stream(slurm_ranks):
    from workbench.notebook import stream
    from workbench.notebook.metrics import metrics

    rs = slurm_ranks
    collector = stream.attach(rs)
    assert collector.address.startswith("tcp://127.0.0.1:")  # every rank on this host: loopback only
    training.setup("ddp", rankset=rs)
    run = training.start(10, rankset=rs)
    assert training.wait(timeout=240, rankset=rs) == {r: "finished" for r in range(4)}
    loss = metrics(run, store=collector.store)
    loss = loss[loss.metric == "loss"]
    for r in range(4):
        assert sorted(loss[loss["rank"] == r].step) == list(range(1, 11))
    assert collector.rejected == 0


def test_sigkill_of_a_rank_is_named_with_host_and_exit(slurm_ranks):
    rs = slurm_ranks
    victim = rs.procs[2]
    t0 = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    while time.monotonic() - t0 < 2.0:
        dead = [d for d in rs.dead() if d["rank"] == 2 and d["exit_code"] is not None]
        if dead:
            break
        time.sleep(0.05)
    assert dead, f"rank 2 not reported with its exit within 2 s: {rs.dead()}"
    assert dead[0]["host"] == rs.info[2]["host"] and dead[0]["exit"] == "killed by SIGKILL"
    with pytest.raises(RankDied, match=r"rank 2 \(host .*\) killed by SIGKILL"):
        rs.apply(lambda: 1, timeout=30)


def test_stop_leaves_no_job_and_no_process(slurm_cluster, slurm_ranks):
    rs = slurm_ranks
    job = rs.job_id
    assert _job_processes(job)
    ours = list(rs.started_pids)
    assert rs.stop() == []
    assert job not in _jobs(slurm_cluster)
    deadline = time.monotonic() + 10
    while _job_processes(job) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _job_processes(job) == []
    assert [p for p in ours if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE] == []


NOTEBOOK = """
import json, sys
from workbench.notebook.cluster import RankSet
from workbench.notebook.cluster.slurm import SlurmRequest
rs = RankSet.start(n=2, backend="gloo", threads=1, launcher="slurm", profile_dir=sys.argv[1],
                   progress=lambda line: None, slurm=SlurmRequest(time="10:00"))
print(json.dumps({"job": rs.job_id, "ranks": [p.pid for p in rs.procs], "controller": rs._controller_pids()}), flush=True)
import time
time.sleep(600)
"""


def test_notebook_killed_cancels_the_job_and_leaves_no_rank(slurm_cluster):
    before = _jobs(slurm_cluster)
    nb = subprocess.Popen(
        [sys.executable, "-c", NOTEBOOK, str(PROFILE)], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    started = None
    try:
        ready, _, _ = select.select([nb.stdout], [], [], 300)
        if ready:
            started = json.loads(nb.stdout.readline())
    finally:
        if started is None:  # it failed or hung: end it (its own stop runs on no signal)
            nb.kill()
            nb.wait(10)
    assert started, "the notebook process did not start its ranks"
    job = started["job"]
    assert any(line.startswith(f"{job} RUNNING") for line in slurm_cluster.squeue())
    assert set(started["ranks"]) <= set(_job_processes(job))
    nb.kill()  # SIGKILL: no clean-up runs in the notebook process
    nb.wait(10)
    pids = started["ranks"] + started["controller"]
    assert _wait_for(lambda: _jobs(slurm_cluster) == before and not _job_processes(job) and not _alive(pids), 30), (
        slurm_cluster.squeue(),
        before,
        _job_processes(job),
        _alive(pids),
    )


@pytest.fixture
def no_current(slurm_cluster):
    """No current rank set for the test; yields the ids of the jobs queued before it."""
    from workbench.notebook import session

    with session.using(None):
        yield _jobs(slurm_cluster)
        api.stop()


def _wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_pending_request_shows_queued_with_reason_and_stop_cancels_it(slurm_cluster, no_current):
    lines: list[str] = []
    outcome: dict = {}

    def start():
        try:
            _start(2, SlurmRequest(nodes=2), progress=lines.append)  # two nodes: the second never comes up
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = exc

    t = threading.Thread(target=start)
    t.start()
    assert _wait_for(lambda: any("PENDING (" in x and "(None)" not in x for x in lines), 30), lines
    queued = [x for x in lines if "PENDING (" in x and "(None)" not in x][-1]
    job = queued.split()[2]
    assert queued.startswith(f"queued: job {job} PENDING (")
    assert any(line.startswith(f"{job} PENDING") for line in slurm_cluster.squeue()), slurm_cluster.squeue()
    # the Lab's registry holds the set as queued, with the job and Slurm's reason, meanwhile
    from workbench.labserver.monitor import Monitor

    def entry():
        return next((e for e in registry.read_all() if (e.get("queue") or {}).get("job_id") == job), None)

    assert _wait_for(lambda: entry() is not None, 10)
    view = Monitor().describe(entry())
    reason = queued.split("(", 1)[1].rstrip(")")
    assert view["state"] == "queued" and view["queue"]["reason"] == reason, view
    assert [r["state"] for r in view["ranks"]] == ["queued", "queued"]
    api.stop()  # from another cell, while the start still waits
    t.join(30)
    assert not t.is_alive()
    assert isinstance(outcome.get("error"), Interrupted) and f"job {job} cancelled" in str(outcome["error"])
    assert _jobs(slurm_cluster) == no_current
    assert entry() is None  # the cancelled start withdrew it


def test_ctrl_c_while_queued_cancels_the_job(slurm_cluster, no_current):
    lines: list[str] = []
    done = threading.Event()

    def interrupt_when_queued():
        # a start not shown queued in time is interrupted all the same (and named below),
        # not left waiting for a node that never comes up until the suite's timeout
        _wait_for(lambda: done.is_set() or any("PENDING" in x for x in lines), 120)
        if not done.is_set():
            _thread.interrupt_main()

    # Ctrl-C raises KeyboardInterrupt, as in a kernel, even where pytest was started with SIGINT
    # ignored (in the background from a script), where interrupt_main would do nothing
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=interrupt_when_queued, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            _start(2, SlurmRequest(nodes=2), progress=lines.append)
    finally:
        done.set()
        signal.signal(signal.SIGINT, before)
    assert any("PENDING" in x for x in lines), f"interrupted before the job was shown queued: {lines}"
    assert _jobs(slurm_cluster) == no_current


def test_a_start_abandoned_at_once_leaves_no_process(slurm_cluster, no_current):
    # sbatch refuses within a second of the controller's start, while the controller still
    # forks its schedulers: the stop that follows must end those too (they outlive it at ppid 1)
    made: list[RankSet] = []
    for _ in range(2):
        with pytest.raises(SlurmError, match="sbatch refused the request"):
            RankSet.start(
                n=2,
                backend="gloo",
                launcher="slurm",
                profile_dir=str(PROFILE),
                progress=lambda line: None,
                on_created=made.append,
                slurm=SlurmRequest(partition="nosuch"),
            )
    ids = {rs.cluster.cluster_id for rs in made}
    assert len(ids) == 2
    left = {}
    for pid, cmd in processes_of([PROFILE]).items():
        try:
            if psutil.Process(pid).environ().get("IPP_CLUSTER_ID") in ids:
                left[pid] = cmd
        except psutil.Error:
            continue
    assert end_leftovers(left, timeout=0) == {}


def test_request_that_can_never_run_is_reported_with_slurms_reason(slurm_cluster, no_current):
    t0 = time.monotonic()
    # more nodes than the partition has: Slurm says PartitionNodeLimit (or PartitionConfig)
    with pytest.raises(SlurmError, match=r"Slurm job \d+ can never run: Partition(NodeLimit|Config); it was cancelled"):
        _start(3, SlurmRequest(nodes=3))
    assert time.monotonic() - t0 < 30
    assert _jobs(slurm_cluster) == no_current
    with pytest.raises(SlurmError, match=r"sbatch refused the request: .*partition"):
        _start(2, SlurmRequest(partition="nosuch"))
    # --gpus-per-node reaches sbatch (this Slurm has no GPUs configured, and says so)
    with pytest.raises(SlurmError, match=r"sbatch refused the request: .*generic resource"):
        _start(2, SlurmRequest(gpus_per_node=1))
    assert _jobs(slurm_cluster) == no_current


def test_start_flags_refused_in_one_line_before_anything_starts(slurm_cluster, no_current):
    from workbench.notebook.commands import UsageError, dispatch

    for line, words in [
        ("start -n 2 --nodes 2", "--nodes go with --launcher slurm"),
        ("start -n 2 --launcher slurm --time soon", "--time 'soon' is not a Slurm time"),
        ("start -n 2 --launcher slurm --sbatch constraint=h100", "takes sbatch options"),
        ("start -n 2 --launcher slurm --ip 10.255.255.1", "not an address of this host"),
        ("start -n 2 --launcher ssh", "needs --hosts"),
        ("start --launcher ssh --hosts a:2,b", "is not HOST:N"),
        ("start --launcher ssh --hosts localhost:1 --ssh-config /nonexistent", "no such file"),
    ]:
        with pytest.raises(UsageError, match=words) as err:
            dispatch(line)
        assert "\n" not in str(err.value)
        assert not api.is_running()
    assert _jobs(slurm_cluster) == no_current
