"""The notebook's rank watcher on plain child processes (the rank-killing tests, with real
ranks, are in test_rank_lifecycle.py and test_failures.py)."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from workbench.notebook.cluster import health


def _switches(tid: int) -> int:
    with open(f"/proc/{os.getpid()}/task/{tid}/status") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")))


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="pidfds are Linux-only: elsewhere the watcher polls")
def test_watcher_sleeps_while_ranks_live_and_sees_a_death_at_once():
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    watcher = None
    try:
        ranks = [health.RankProcess(r, socket.gethostname(), p.pid) for r, p in enumerate(procs)]
        watcher = health.Watcher(ranks)
        time.sleep(0.3)  # started, pidfds opened
        tid = watcher._thread.native_id
        before = _switches(tid)
        time.sleep(2.0)
        # polling every 0.25 s would wake it 8 times; on pidfds it looks once a second at most
        assert _switches(tid) - before <= 3
        assert watcher.deaths == {}
        procs[1].send_signal(signal.SIGKILL)
        t0 = time.monotonic()
        while 1 not in watcher.deaths and time.monotonic() - t0 < 5:
            time.sleep(0.01)
        assert time.monotonic() - t0 < 0.5, "the death was not seen at once"
        assert watcher.deaths[1]["pid"] == procs[1].pid and 0 not in watcher.deaths
        assert watcher._thread.is_alive()  # and goes on watching the others
    finally:
        if watcher is not None:
            watcher.close()
            watcher._thread.join(3)
        for p in procs:
            p.kill()
            p.wait(10)
    assert not watcher._thread.is_alive()
