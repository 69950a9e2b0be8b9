"""A notebook process that dies without stopping its ranks leaves no orphan behind."""

import os
import subprocess
import sys
import time

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
