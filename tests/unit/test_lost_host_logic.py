"""A lost host: the silence that names it (a real guard and lifeline on loopback) and the
size a recovery restarts at on the hosts left (pure logic). The link itself is taken down
in ``tests/cluster/test_lost_host.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from workbench.engine.control import largest_size
from workbench.notebook.cluster.lifeline import HOST_SILENCE_S, Lifeline
from workbench.notebook.cluster.ssh import remaining_hosts
from workbench.notebook.runs.budget import describe
from workbench.shared import wire


def test_hosts_left_drop_the_lost_entries_and_fill_the_rest_in_order():
    hosts = "localhost:2,root@b:2,c:4"
    assert remaining_hosts(hosts, {"root@b"}) == ("localhost:2,c:4", 6)
    assert remaining_hosts(hosts, {"root@b"}, 3) == ("localhost:2,c:1", 3)
    assert remaining_hosts(hosts, {"root@b", "c"}, 8) == ("localhost:2", 2)
    assert remaining_hosts("root@b:2", {"root@b"}) == ("", 0)


def test_largest_size_the_layout_allows():
    assert largest_size("ddp", 2) == 2  # the teaching trainer's global batch (8)
    assert largest_size("ddp", 3, 8) == 2  # a global batch of 8 does not split over 3 ranks
    assert largest_size("ddp", 3, 12) == 3
    assert largest_size("fsdp2 tp=2", 3, 8) == 2  # tp=2 must divide the world
    assert largest_size("hsdp dp_replicate=2", 6, 8) == 4  # 2 x 3 would split a batch of 8 over 6
    with pytest.raises(ValueError, match=r"'fsdp2 tp=4' fits no size of 1..3 ranks \(the hosts left\)"):
        largest_size("fsdp2 tp=4", 3, 8)


def test_a_host_lost_record_names_the_host_and_the_new_size():
    rec = {
        "n": 1,
        "kind": "host lost",
        "rank": 2,
        "host": "hostb",
        "detail": "lost with its host: no heartbeat from hostb for 3.0 s",
        "failed_step": 16,
        "world_size": 2,
        "from_world_size": 4,
        "hosts": "localhost:2",
        "checkpoint": "step-00000010",
        "checkpoint_step": 10,
        "steps_redone": 6,
        "down_s": 9.2,
        "lost_s": 12.0,
    }
    assert describe(rec) == (
        "failure 1: host hostb lost at step 16: lost with its host: no heartbeat from hostb for 3.0 s; "
        "restarted 2 ranks (was 4) on localhost:2, loaded step-00000010 (step 10), 6 steps redone, 12.0 s lost"
    )


def _guard(lifeline: Lifeline, seconds: float) -> subprocess.Popen:
    env = dict(os.environ, **lifeline.env())
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "workbench.engine.guard",
            "--",
            sys.executable,
            "-c",
            f"import time; time.sleep({seconds})",
        ],
        env=env,
        stderr=subprocess.DEVNULL,
    )


def _wait(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


def test_a_silent_guard_names_its_host_lost_and_one_that_ended_does_not():
    """SIGSTOP on a guard: its beats stop and nothing closes, as on a link that went down."""
    lost = []
    life = Lifeline("127.0.0.1", os.urandom(32), on_lost=lambda host, s: lost.append((host, s, time.monotonic())))
    ended = _guard(life, 0.2)  # says hello, its child ends: an exit, then a closed connection
    stuck = None
    try:
        assert _wait(lambda: life.exits, 20)
        ended.wait(10)
        time.sleep(HOST_SILENCE_S + wire.BEAT_S)  # a host whose only rank ended is not lost
        assert lost == [] and life.lost == {}
        stuck = _guard(life, 60)
        assert _wait(lambda: len(life.hellos) == 2, 20)
        time.sleep(2 * wire.BEAT_S)
        t0 = time.monotonic()
        os.kill(stuck.pid, signal.SIGSTOP)
        assert _wait(lambda: lost, HOST_SILENCE_S + 3)
        ((host, silent, at),) = lost
        assert host == life.hellos[-1]["host"] and silent >= HOST_SILENCE_S
        assert at - t0 <= HOST_SILENCE_S + 1.0  # the last beat came at most one beat before the stop
        assert list(life.lost) == [host]
    finally:
        if stuck is not None:
            os.kill(stuck.pid, signal.SIGCONT)
        t = time.monotonic()
        life.close(wait=5)  # the lost host's guard is not waited for
        assert time.monotonic() - t < 2
        for p in (ended, stuck):
            if p is not None:
                p.wait(15)  # the guard sees the notebook's end close and ends its child
