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
