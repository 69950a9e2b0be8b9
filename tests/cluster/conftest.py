"""Fixtures with real cluster daemons: a single-node Slurm and a second host over SSH.

Both are started by the tests and torn down by them (by the pids and names they made);
the suite skips them, saying why, on a machine without the packages or without root
(``.ci/run`` installs them, and under ``CI=true`` the suite's runner fails on such a skip).
"""

from __future__ import annotations

import os
import pathlib

import psutil
import pytest

from .daemons import SecondHost, Slurm, end_leftovers, missing_tools, processes_of

# the ipyparallel profiles the cluster tests start their rank sets under
PROFILES = pathlib.Path(__file__).resolve().parents[2] / ".state" / "test"


def _skip_reason() -> str | None:
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "the cluster daemons (munged, slurmd, a network namespace) need root"
    missing = missing_tools()
    if missing:
        packages = sorted({m.split("(")[1].rstrip(")") for m in missing})
        return f"not installed: {', '.join(missing)} (apt-get install {' '.join(packages)}; .ci/run installs them)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _skip_reason()
    for item in items:
        if "tests/cluster/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.cluster)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="module")
def slurm_cluster():
    """munged + slurmctld + slurmd (and a declared node that never comes up); SLURM_CONF set."""
    cluster = Slurm()
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        cluster.close()


@pytest.fixture(scope="module")
def second_host():
    """A network namespace with its own host name and address, running sshd."""
    host = SecondHost()
    try:
        yield host
    finally:
        host.close()


@pytest.fixture(scope="module", autouse=True)
def no_process_left():
    """After a module (its rank sets stopped, its daemons gone): no process it started.

    Set up before, so torn down after, every other fixture of the module; a process
    left is named, ended by its pid, and fails the module.
    """
    if _skip_reason():
        yield
        return
    profiles = [
        PROFILES / n
        for n in (
            "slurm-profile",
            "ssh-profile",
            "ray-profile",
            "lost-host-profile",
            "sync-profile",
            "sync-ray-profile",
        )
    ]
    before = {pid for pid in processes_of(profiles)}
    created = {pid: _created(pid) for pid in before}
    yield
    now = {
        pid: cmd for pid, cmd in processes_of(profiles).items() if pid not in before or _created(pid) != created[pid]
    }
    left = end_leftovers(now)
    assert left == {}, f"processes left behind by this module (ended now): {left}"


def _created(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
