"""The server extension's view of a queued Slurm rank set and of GPUs (NVML present or not).

A pending Slurm job is driven for real in tests/cluster/test_slurm.py; here the registry entry
of a queued set is written by ``registry.queued`` from an unstarted RankSet, as the kernel
writes it while its job waits. NVML is a stand-in (tests/nvml_standin.py): no GPU runs here.
"""

from __future__ import annotations

import json
import os
import socket
import sys

import nvml_standin  # tests/ is on sys.path (its conftest.py)
import pytest

from workbench.labserver import monitor
from workbench.labserver.monitor import Monitor
from workbench.notebook import registry
from workbench.notebook.cluster import RankSet, RankSetConfig
from workbench.notebook.cluster.slurm import JobState


@pytest.fixture
def view():
    """``describe`` of a fresh Monitor, closed afterwards (its controller threads ended)."""
    m = Monitor()
    yield m.describe
    m.close()


@pytest.fixture
def unstarted():
    rs = RankSet(RankSetConfig(n=2, launcher="slurm", backend="gloo"))
    rs.job_id = "812"
    yield rs
    registry.withdraw(rs)


def test_queued_set_shows_job_and_reason_then_starting(unstarted, view):
    entry_id = registry.queued(unstarted, JobState("812", "PENDING", "Resources", ()))
    entry = registry.read(entry_id)
    assert entry["stale"] is False and entry["queue"]["job_id"] == "812" and entry["job_id"] == "812"
    got = view(entry)
    assert got["state"] == "queued" and got["launcher"] == "slurm" and got["world_size"] == 2
    assert got["queue"] == {"job_id": "812", "state": "PENDING", "reason": "Resources", "nodes": []}
    assert [(r["rank"], r["state"], r["pid"], r["gpu"]) for r in got["ranks"]] == [
        (0, "queued", None, None),
        (1, "queued", None, None),
    ]
    # Slurm's reason changes while it waits: the same entry is rewritten, not a second one
    registry.queued(unstarted, JobState("812", "PENDING", "Priority", ()))
    assert [e["id"] for e in registry.read_all()].count(entry_id) == 1
    assert view(registry.read(entry_id))["queue"]["reason"] == "Priority"
    # allocated: the ranks are registering
    registry.queued(unstarted, JobState("812", "RUNNING", "None", ("node1",)))
    got = view(registry.read(entry_id))
    assert got["state"] == "starting" and [r["state"] for r in got["ranks"]] == ["starting"] * 2
    assert got["queue"]["nodes"] == ["node1"]
    # a start that fails or is cancelled withdraws it
    registry.withdraw(unstarted)
    assert registry.read(entry_id) is None


def test_a_stop_from_the_sidebar_is_seen_by_the_next_cell(unstarted):
    """The kernel asks before every cell whether its set was stopped elsewhere; it reads the
    entry again only when the file changed, and the server's update changes it."""
    entry_id = registry.queued(unstarted, JobState("812", "RUNNING", "None", ("node1",)))
    assert registry.stopped_elsewhere(unstarted) is None
    assert registry.stopped_elsewhere(unstarted) is None  # unchanged file: the answer kept
    registry.update(entry_id, stopped_by=registry.STOP_NOTE)
    assert registry.stopped_elsewhere(unstarted) == registry.STOP_NOTE


def _entry_with_this_process_as_rank() -> dict:
    """An entry whose one rank is this process (real pid and memory; its controller unreachable)."""
    return {
        "id": "test-gpu-view",
        "host": socket.gethostname(),
        "kernel_pid": os.getpid(),
        "connection_file": "/nonexistent/ipcontroller-client.json",
        "world_size": 1,
        "ranks": [{"rank": 0, "engine_id": 0, "host": socket.gethostname(), "pid": os.getpid(), "device": "cuda:0"}],
    }


def test_without_nvml_no_gpu_values_and_no_error(monkeypatch, view):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed: import fails
    assert monitor.gpu_usage() is None
    row = view(_entry_with_this_process_as_rank())["ranks"][0]
    assert row["gpu"] is None and row["memory_mb"] > 1
    # installed, but no driver / no GPU: nvmlInit fails; still nothing shown, nothing raised
    monkeypatch.setitem(sys.modules, "pynvml", nvml_standin)
    monkeypatch.delenv(nvml_standin.ENV, raising=False)
    assert monitor.gpu_usage() is None
    assert view(_entry_with_this_process_as_rank())["ranks"][0]["gpu"] is None


def test_with_nvml_each_rank_gets_its_gpu_memory_and_utilisation(monkeypatch, tmp_path, view):
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"util": 37, "processes": {str(os.getpid()): 1234.5, "1": 99}}))
    monkeypatch.setenv(nvml_standin.ENV, str(state))
    monkeypatch.setitem(sys.modules, "pynvml", nvml_standin)
    usage = monitor.gpu_usage()
    assert usage[os.getpid()] == {"device": 0, "memory_mb": 1234.5, "util": 37}
    row = view(_entry_with_this_process_as_rank())["ranks"][0]
    assert row["gpu"] == {"device": 0, "memory_mb": 1234.5, "util": 37}
