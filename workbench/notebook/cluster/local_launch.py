"""Ranks on this host: forked by one process that has imported torch or jax (``--launcher local``),
or started by one of ipyparallel's own launchers (``mpi``, or any launcher given
``launcher_options``). ``start`` is this engine's part of ``RankSet.start``."""

from __future__ import annotations

import os
import time

from .. import background
from . import controller_process, controller_watch, launchers, standby


def start(rs) -> None:
    """Start the controller and the engines; return once all ``n`` registered."""
    cfg = rs.config
    if cfg.launcher == "local" and not cfg.launcher_options:
        # first of all, the process that imports torch and forks the ranks: the standby
        # started when the extension loaded (its import done, or under way), else a new one
        # whose imports overlap with ipyparallel's in this process and the controller's start
        rs.forked = standby.take(cfg.framework)
        rs.preloaded = rs.forked is not None
        if rs.forked is None:
            rs.forked = launchers.ForkedRanks(cfg.framework)
        rs.started_pids.append(rs.forked.pid)
    import ipyparallel as ipp

    kwargs = launchers.cluster_kwargs(cfg.launcher, cfg.n, options=cfg.launcher_options, framework=cfg.framework)
    if cfg.profile_dir:
        kwargs["profile_dir"] = cfg.profile_dir
    rs.cluster = ipp.Cluster(**kwargs)
    # the controller ends with this process, or with the one its owner file names (detach)
    rs.cluster.controller_args = [*rs.cluster.controller_args, controller_process.OWNER_FLAG + rs.owner_file()]
    controller_watch.start_controller(rs.cluster)
    rs._note_controller()
    if rs.forked is not None:
        rs.exit_dir = os.path.join(rs.state_dir(), "exits")
        rs.forked.setup(cfg.n, rs.cluster, kwargs["config"].EngineLauncher.engine_args, rs.exit_dir)
    else:
        rs.cluster.start_engines_sync()
        rs.started_pids.extend(rs._launcher_pids())
    rs.client = rs._connect_client()
    limit = max(60, 10 * cfg.n)
    deadline = time.monotonic() + limit
    while True:
        try:
            rs.client.wait_for_engines(cfg.n, timeout=0.25, block=True, interactive=False)
            break
        except TimeoutError:
            controller_watch.check(rs.cluster)
            if rs.forked is not None and rs.forked.ended() is not None:
                raise RuntimeError(
                    f"the process that starts the ranks ended (exit {rs.forked.ended()}) before "
                    f"{cfg.n - len(rs.client.ids)} of {cfg.n} ranks registered; its output:\n" + rs.forked.output()
                ) from None
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(rs.client.ids)} of {cfg.n} ranks registered within {limit} s"
                    + (f"; the ranks' output:\n{rs.forked.output()}" if rs.forked is not None else "")
                ) from None
    # registered: from now on the controller only routes, and gives way to the ranks
    background.lower_processes(rs._controller_pids())
