"""The registry the JupyterLab extension reads: entries written at start, stale ones found and cleaned."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

from workbench.notebook import registry


def test_entry_describes_the_rank_set_and_is_private(ranks2):
    entry_id = registry.announce(ranks2)
    try:
        path = registry.path_of(entry_id)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600  # holds the stream key: this user only
        entry = json.load(open(path))
        assert entry["kernel_pid"] == os.getpid()
        assert entry["world_size"] == 2
        assert [r["pid"] for r in entry["ranks"]] == [row["pid"] for row in ranks2.status()]
        assert os.path.exists(entry["connection_file"])
        assert entry["stream"]["address"].startswith("tcp://127.0.0.1:") and len(entry["stream"]["server_key"]) == 40
        listed = {e["id"]: e for e in registry.read_all()}
        assert listed[entry_id]["stale"] is False
    finally:
        registry.withdraw(ranks2)
    assert not os.path.exists(path)
    assert entry_id not in {e["id"] for e in registry.read_all()}


def test_entry_of_a_gone_kernel_is_stale_and_cleaned():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    import psutil

    born = psutil.Process(child.pid).create_time()
    base = {"version": registry.VERSION, "host": None, "started": 1.0, "ranks": [], "world_size": 0}
    registry.write({**base, "id": "test-gone", "kernel_pid": child.pid, "kernel_started": born})
    registry.write({**base, "id": "test-reused", "kernel_pid": os.getpid(), "kernel_started": born - 1000})
    registry.write(
        {**base, "id": "test-live", "kernel_pid": os.getpid(), "kernel_started": psutil.Process().create_time()}
    )
    try:
        states = {e["id"]: e["stale"] for e in registry.read_all() if e["id"].startswith("test-")}
        assert states == {"test-gone": False, "test-reused": True, "test-live": False}
        child.kill()
        child.wait()
        states = {e["id"]: e["stale"] for e in registry.read_all() if e["id"].startswith("test-")}
        assert states == {"test-gone": True, "test-reused": True, "test-live": False}
        cleaned = {e["id"] for e in registry.clean()}
        assert {"test-gone", "test-reused"} <= cleaned and "test-live" not in cleaned
        assert [e["id"] for e in registry.read_all() if e["id"].startswith("test-")] == ["test-live"]
    finally:
        for name in ("test-gone", "test-reused", "test-live"):
            registry.remove(name)


def test_death_seen_by_the_kernel_is_written_with_its_exit(fresh_ranks):
    import signal
    import time

    rs = fresh_ranks(2)  # through the API: its "started" hook announces the set
    entry_id = registry.entry_id_of(rs)
    assert entry_id is not None and registry.read(entry_id) is not None
    os.kill(rs.procs[1].pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and "1" not in (registry.read(entry_id) or {}).get("deaths", {}):
        time.sleep(0.05)
    assert registry.read(entry_id)["deaths"]["1"]["exit"] == "killed by SIGKILL"
    from workbench.notebook import api

    api.stop()
    assert registry.read(entry_id) is None


def test_bad_entry_id_is_refused():
    import pytest

    with pytest.raises(ValueError, match="not a rank set id"):
        registry.path_of("../escape")
