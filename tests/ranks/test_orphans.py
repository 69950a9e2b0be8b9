"""A notebook process that dies without stopping its ranks leaves no orphan behind; what the
controller and the ranks need of the system (descriptors) they take themselves."""

import os
import subprocess
import sys
import time

import pytest
from conftest import ROOT, alive

SCRIPT = """
import os, sys, time
sys.path.insert(0, {root!r})
import workbench
rs = workbench.start(2, backend="gloo", threads=1)
print("PIDS", *rs.started_pids, flush=True)
time.sleep(600)
"""


def test_ranks_and_controller_end_when_the_notebook_is_killed():
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(root=str(ROOT))], stdout=subprocess.PIPE, text=True, env=dict(os.environ)
    )
    pids = []
    try:
        for line in proc.stdout:
            if line.startswith("PIDS "):
                pids = [int(p) for p in line.split()[1:]]
                break
        assert len(pids) >= 3 and len(alive(pids)) == len(pids)
        proc.kill()  # no atexit, no clean-up: as when a kernel is killed
        proc.wait(10)
        deadline = time.monotonic() + 3  # the README: within a second or two
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.25)
        assert alive(pids) == [], f"orphans left after the notebook died: {alive(pids)}"
    finally:
        proc.kill()
        for pid in alive(pids):
            os.kill(pid, 9)


CONTROLLER_ONLY = """
import sys, time
sys.path.insert(0, {root!r})
import ipyparallel as ipp
import psutil
from workbench.notebook.cluster import launchers
kwargs = launchers.cluster_kwargs("slurm", 2, guarded=True)
kwargs.pop("engines")
c = ipp.Cluster(profile_dir={profile!r}, **kwargs)
c.start_controller_sync()
ctl = psutil.Process(c.controller.process.pid)
deadline = time.monotonic() + 60
while len(ctl.children()) < 3 and time.monotonic() < deadline:  # its schedulers
    time.sleep(0.05)
time.sleep(0.5)
print("PIDS", ctl.pid, *[p.pid for p in ctl.children(recursive=True)], flush=True)
time.sleep(600)
"""


def test_controller_ends_with_the_notebook_when_no_rank_runs_on_its_host(tmp_path):
    """Slurm/SSH ranks run on other hosts, and their guards end them before any rank could end
    the controller: the controller (and the schedulers it forked) must see the notebook go itself."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER_ONLY.format(root=str(ROOT), profile=str(tmp_path / "profile"))],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )
    pids = []
    try:
        for line in proc.stdout:
            if line.startswith("PIDS "):
                pids = [int(p) for p in line.split()[1:]]
                break
        assert len(pids) >= 4 and len(alive(pids)) == len(pids)
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 3
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive(pids) == [], f"controller processes left after the notebook died: {alive(pids)}"
    finally:
        proc.kill()
        for pid in alive(pids):
            os.kill(pid, 9)


def _killed_kernel_leaves_nothing(code: str, within: float = 3.0) -> None:
    """Run ``code`` in a new kernel (it prints ``PIDS ...``), kill the kernel by pid: every one
    of those pids is gone ``within`` seconds."""
    from jupyter_client.manager import start_new_kernel
    from kernel_runs import execute, printed

    km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
    pids = []
    try:
        reply, msgs = execute(kc, code)
        assert reply["status"] == "ok", printed(msgs)
        pids = [int(p) for p in next(ln for ln in printed(msgs).splitlines() if ln.startswith("PIDS ")).split()[1:]]
        assert pids and len(alive(pids)) == len(pids)
        os.kill(km.provisioner.process.pid, 9)  # the kernel, by pid: no clean-up at all
        deadline = time.monotonic() + within
        while alive(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive(pids) == [], f"left {within} s after the kernel was killed: {alive(pids)}"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        for pid in alive(pids):
            os.kill(pid, 9)


def test_a_standby_ends_with_its_kernel_even_while_it_imports_torch():
    """Killed a moment after `%load_ext workbench`: the standby is still importing torch, and
    goes at once (it would otherwise finish that import, over a second, then see its stdin closed)."""
    _killed_kernel_leaves_nothing(
        "%load_ext workbench\nfrom workbench.notebook.cluster import standby\nprint('PIDS', standby.current().pid)",
        within=1.0,
    )


def test_ranks_forked_from_the_standby_end_with_their_kernel():
    _killed_kernel_leaves_nothing(
        "%load_ext workbench\nimport time; time.sleep(2)\n%distrain start -n 2 --backend gloo --threads 1\n"
        "from workbench.notebook import api\nrs = api.current()\nassert rs.preloaded\n"
        "print('PIDS', *rs.started_pids)"
    )


def test_the_controllers_children_end_when_the_controller_is_killed(fresh_ranks):
    """A controller SIGKILLed from outside: its heart monitor, schedulers and queues (forked
    children, re-parented to init) end too, rather than live on."""
    import psutil

    rs = fresh_ranks(2)
    ctl = psutil.Process(rs.cluster.controller.process.pid)
    children = [p.pid for p in ctl.children(recursive=True)]
    try:
        assert len(children) >= 4 and len(alive(children)) == len(children)  # hub's queues, monitor, schedulers
        names = {psutil.Process(pid).name() for pid in children}
        os.kill(ctl.pid, 9)
        deadline = time.monotonic() + 3
        while alive(children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive(children) == [], f"children of the killed controller left: {alive(children)} of {names}"
    finally:
        for pid in alive(children):
            os.kill(pid, 9)


LIMITS = """
import json, os, sys
sys.path.insert(0, {root!r})
import workbench

def limit(pid):
    with open(f"/proc/{{pid}}/limits") as f:
        return next(int(line.split()[3]) for line in f if line.startswith("Max open files"))

rs = workbench.start(2, backend="gloo", threads=1)
seen = {{"own": limit(os.getpid()), "ranks": [limit(p.pid) for p in rs.procs],
         "controller": [limit(p) for p in rs._controller_pids()]}}
workbench.stop()
print(json.dumps(seen), flush=True)
"""


def test_the_controller_and_the_ranks_run_at_the_hard_descriptor_limit():
    """The controller holds ~8 connections per rank and a rank one per gloo peer: from a
    notebook started with the common 1,024-descriptor soft limit, both raise theirs to the
    hard limit (a set of a few hundred ranks would otherwise stop at "Too many open files");
    the notebook's own limit is left as it was."""
    import json
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1024:
        pytest.skip(f"the hard limit here is {hard}: nothing to raise")
    low = 1024

    def lower():
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

    done = subprocess.run(
        [sys.executable, "-c", LIMITS.format(root=str(ROOT))],
        preexec_fn=lower,
        capture_output=True,
        text=True,
        timeout=180,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    want = hard if hard != resource.RLIM_INFINITY else seen["ranks"][0]
    assert seen["own"] == low
    assert seen["ranks"] == [want, want], seen
    assert seen["controller"] and set(seen["controller"]) == {want}, seen
