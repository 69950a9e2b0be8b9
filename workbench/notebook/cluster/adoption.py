"""A running rank set passed from one notebook-side process to another (``%distrain detach``/``attach``).

Everything :class:`~.rankset.RankSet` knows of its processes is pids, files and addresses, so
another process on this host can hold the same set (:func:`adopt`: a client to the same
controller, the same pids watched) and make it end with itself (:func:`rehome`). Only sets
whose every process is on this host and was started by the notebook (``--launcher local``)
can move: the guards of SSH/Slurm/Ray ranks hold a connection to the notebook process itself.
"""

from __future__ import annotations

import os
import tempfile

from ...engine import rpc
from . import health
from .rankset import RankSet


def refusal(rs) -> str | None:
    """Why ``rs`` cannot be handed to another process, or None."""
    cfg = rs.config
    if cfg.launcher != "local" or cfg.launcher_options or rs.lifeline is not None:
        return (
            f"a set started with --launcher {cfg.launcher} cannot be detached: its ranks on other hosts "
            "end with this kernel's connection; detach works for --launcher local sets"
        )
    if not all(p.local for p in rs.procs):
        return "a set with ranks on other hosts cannot be detached (detach works for --launcher local sets)"
    return None


def export(rs) -> dict:
    """What another process needs to hold ``rs`` (plain data; the kernel's client is not in it)."""
    return {
        "config": rs.config,
        "cluster": rs.cluster.to_dict(),
        "engine_ids": list(rs.engine_ids),
        "info": list(rs.info),
        "procs": [(p.rank, p.host, p.pid) for p in rs.procs],
        "exit_dir": rs.exit_dir,
        "deaths": dict(rs.watcher.deaths) if rs.watcher is not None else {},
        "started_pids": list(rs.started_pids),
        "secret": rs.secret,
        "listen_ip": rs.listen_ip,
        "controller_session": rs._controller_session,
        "start_seconds": rs.start_seconds,
    }


def adopt(state: dict) -> RankSet:
    """A :class:`RankSet` in this process for the running set ``state`` describes: a client to the same
    controller (ipyparallel's ``Cluster.from_dict``), the same pids watched, exactly what the set started to stop."""
    import ipyparallel as ipp

    rs = RankSet(state["config"])
    rs.cluster = ipp.Cluster.from_dict(state["cluster"], log=_quiet_log())
    rs.engine_ids = list(state["engine_ids"])
    rs.info = list(state["info"])
    rs.exit_dir = state["exit_dir"]
    rs.procs = [health.RankProcess(r, host, pid, exit_dir=rs.exit_dir) for r, host, pid in state["procs"]]
    rs.started_pids = list(state["started_pids"])
    rs.secret = state["secret"]
    rs.listen_ip = state["listen_ip"]
    rs._controller_session = state["controller_session"]
    rs.start_seconds = state["start_seconds"]
    rs.client = rs._connect_client()
    rs.watcher = health.Watcher(rs.procs)
    for rank, death in state["deaths"].items():
        rs.watcher.deaths.setdefault(rank, death)
    return rs


def _quiet_log():
    from .launchers import _quiet_logger

    return _quiet_logger()


def rehome(rs, pid: int) -> None:
    """Make ``rs`` end with process ``pid`` (it watches the ranks and may stop them) from now on:
    each rank's watch (``engine.runtime.rehome``) and the controller's owner file (``controller_process``)."""
    write_owner(rs, pid)
    live = [r for r in range(rs.world_size) if r not in (rs.watcher.known() if rs.watcher else {})]
    if live:
        rs.apply(rpc.handle, rpc.Rehome(owner_pid=pid), ranks=live, timeout=30)


def write_owner(rs, pid: int) -> None:
    """The controller's owner file (read when its current owner dies), replaced whole."""
    path = rs.owner_file()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".owner-")
    with os.fdopen(fd, "w") as f:
        f.write(f"{pid}\n")
    os.replace(tmp, path)


def release(rs) -> None:
    """This process lets go of ``rs`` without stopping it (another one holds it now)."""
    if rs.watcher is not None:
        rs.watcher.close()
    if rs.client is not None:
        try:
            rs.client.close()
        except Exception:
            pass
    rs.client = None
    if rs.cluster is not None:
        rs.cluster.shutdown_atexit = False  # ipyparallel would stop the controller when this process exits
