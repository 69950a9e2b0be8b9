"""New ranks in the places of some ranks of a running set, the others untouched.

For a fault-tolerant run (``notebook.runs.fault_tolerant``): a replica group that lost a rank is
replaced while the other replicas keep training. New engines join the same controller (one
more forking process, as ``local_launch`` starts the first ones), take the lost ranks'
numbers, and are bootstrapped without the set's process group (a process group cannot take
a new member; the run talks over its replicas' own groups). Only forked local ranks
(``--launcher local``) are replaced this way.
"""

from __future__ import annotations

import os
import time

from ...engine import rpc
from . import health, launchers


def check_replaceable(rs) -> None:
    """Refuse a rank set whose ranks cannot be replaced one by one (before anything starts)."""
    cfg = rs.config
    if rs.forked is None or cfg.launcher != "local" or cfg.launcher_options or cfg.framework != "torch":
        raise ValueError(
            "--fault-tolerant replaces lost ranks on this host: it runs on ranks started with "
            f"`%distrain start -n N` (--launcher local, torch); this set was started with --launcher {cfg.launcher}"
            + (" and launcher options" if cfg.launcher_options else "")
        )


# what a replacement rank imports before it can step (torch._dynamo: the first optimizer's; torchft: the
# Manager's): seconds of CPU a rank, paid ahead by the spare (:func:`spare`), not after a failure
SPARE_IMPORTS = ("torch._dynamo", "torchft")


def spare(rs) -> None:
    """A forking parent for the next replacement, its imports done ahead (``rs.spare``): a replacement
    from it is a fork away, not a process start, torch's import and the above (the replacement's
    time with and without it: docs/unattended.md). One per set, kept until used or the set stops;
    it ends once the notebook does (end of file on its stdin)."""
    if rs.spare is not None and rs.spare.ended() is None:
        return
    if rs.spare is not None:  # it died: its output file
        rs.spare.close()
    rs.spare = launchers.ForkedRanks(rs.config.framework, imports=SPARE_IMPORTS)
    rs.started_pids.append(rs.spare.pid)


def replace_ranks(rs, ranks: list[int], *, timeout: float | None = None) -> list[dict]:
    """End ``ranks`` (dead or alive, by pid), start as many new engines, make them those ranks.
    The set's spare forks them where it has one (:func:`spare`), else a new forking parent.

    Returns the new ranks' bootstrap descriptions, in the order of ``ranks``.
    """
    check_replaceable(rs)
    cfg = rs.config
    ranks = sorted(ranks)
    health.end_pids([rs.procs[r].pid for r in ranks if rs.procs[r].alive()], grace=0.2)
    before = set(rs.client.ids) | set(rs.engine_ids)
    fork, rs.spare = rs.spare, None
    # the ranks inherit its environment and working directory: as for the kernel's standby, a
    # notebook that changed either since (or a spare that died) gets a fresh process
    if fork is None or fork.ended() is not None or fork.environ != dict(os.environ) or fork.cwd != os.getcwd():
        if fork is not None:
            if fork.ended() is None:
                health.end_pids([fork.pid], grace=0.2)
            fork.close()
        fork = launchers.ForkedRanks(cfg.framework)
        rs.started_pids.append(fork.pid)
    rs.replacements.append(fork)
    kwargs = launchers.cluster_kwargs(cfg.launcher, cfg.n, framework=cfg.framework)
    fork.setup(len(ranks), rs.cluster, kwargs["config"].EngineLauncher.engine_args, rs.exit_dir)
    limit = timeout or max(120.0, 30.0 * len(ranks))
    deadline = time.monotonic() + limit
    while True:
        new = sorted(set(rs.client.ids) - before)
        if len(new) >= len(ranks):
            break
        if fork.ended() is not None:
            raise RuntimeError(
                f"the process that starts the replacement ranks ended (exit {fork.ended()}); its output:\n"
                + fork.output()
            )
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(new)} of {len(ranks)} replacement ranks registered within {limit:.0f} s")
        time.sleep(0.1)
    new = new[: len(ranks)]
    stack_dir = os.path.join(rs.state_dir(), "stacks")
    backend = rs.info[0].get("backend", "gloo") if rs.info else "gloo"
    pending = [
        rs.client[eid].apply_async(
            rpc.handle,
            rpc.Bootstrap(
                rank=rank,
                world_size=cfg.n,
                local_rank=rank,
                local_world_size=cfg.n,
                master_addr="127.0.0.1",
                master_port=0,
                backend=backend,
                timeout_s=cfg.timeout,
                threads=cfg.threads_per_rank(),
                stack_dir=stack_dir,
                sys_path=(os.getcwd(), *cfg.sys_path),
                parent_pid=os.getpid(),
                framework=cfg.framework,
                process_group=False,
            ),
        )
        for rank, eid in zip(ranks, new)
    ]
    infos = [ar.get(timeout=max(120, cfg.timeout)) for ar in pending]
    listeners = list(rs.watcher.listeners) if rs.watcher is not None else []
    if rs.watcher is not None:
        rs.watcher.close()
    for rank, eid, info in zip(ranks, new, infos):
        rs.engine_ids[rank] = eid
        rs.info[rank] = info
        rs.procs[rank] = health.RankProcess(rank, info["host"], info["pid"], exit_dir=rs.exit_dir)
    rs._views.clear()
    rs.started_pids = sorted(set(rs.started_pids) | {i["pid"] for i in infos})
    rs.watcher = health.Watcher(rs.procs)  # watches the new pids (the old ones' pidfds are spent)
    rs.watcher.listeners.extend(listeners)  # those told of deaths (the Lab registry) go on being told
    return infos
