"""The Python API behind the magics, acting on the current session's rank set.

Everything ``%distrain`` does is a call here, so the same steps work from a script
or a plain Python cell: ``workbench.start(4)``, ``workbench.run("...")``,
``workbench.stop()``. Several named sets may run at once (``start(2, session="ddp")``,
``use("ddp")``); what one session keeps lives in its :class:`~.session.Session`.
"""

from __future__ import annotations

import atexit

from ..shared import output_cut
from ..shared.code_tree import parse_size
from ..shared.nccl import nccl_env
from .cluster import AlreadyRunning, NotRunning, RankSet, RankSetConfig, code_sync
from .cluster.cell import GRACE_S, run_cell
from .cluster.code_sync import DEFAULT_LIMIT, SyncSettings
from .keywords import refuse
from .session import DEFAULT, KERNEL, Session


def on(event: str, fn) -> None:
    """Register ``fn(rankset)`` to run when a rank set has ``started`` or is ``stopping``.

    ``check`` functions run whenever the current set is asked for; one that returns a
    text (the ranks were ended from outside this kernel) makes the set stopped, with it.
    ``queued`` functions get ``(rankset, job_state)`` while a Slurm job waits for its
    allocation; ``abandoned`` ones get a set whose start failed or was cancelled.

    Other parts (telemetry stream, trainer control) attach to new rank sets this way
    instead of the rank set knowing about them.
    """
    KERNEL.listeners[event].append(fn)


def _others(but: str | None) -> str:
    others = [n for n in KERNEL.running() if n != but]
    return f"; running: {', '.join(others)} (`%distrain use --session NAME`)" if others else ""


def current() -> RankSet:
    """The current session's running rank set; a clear error where there is none."""
    sess = KERNEL.current()
    rs = sess.rankset if sess is not None else None
    for fn in KERNEL.listeners["check"] if rs is not None and rs.running else ():
        note = fn(rs)
        if note:  # e.g. the Lab sidebar ended the ranks while this kernel was busy
            stop()
            raise NotRunning(f"the ranks were {note}; start them again with `%distrain start -n 2`")
    if rs is None or not rs.running:
        what = (
            f"the rank set {sess.name!r} is not running"
            if sess is not None and sess.name != DEFAULT
            else "no ranks are running"
        )
        raise NotRunning(
            f"{what}: start them with `%distrain start -n 2` (or workbench.start(2))"
            + _others(sess.name if sess else None)
        )
    return rs


def is_running() -> bool:
    sess = KERNEL.current()
    return sess is not None and sess.running


def session(name: str | None = None, /) -> Session:
    """The session named ``name`` (default: the current one)."""
    if name is None:
        sess = KERNEL.current()
        if sess is None:
            raise NotRunning("no session yet: start one with `%distrain start -n 2 [--session NAME]`")
        return sess
    return KERNEL.get(name)


def sessions() -> dict[str, Session]:
    """Every named session of this kernel (running or stopped), by name."""
    return dict(KERNEL.by_name)


def use(session: str | None = None, **earlier) -> Session:
    """Make the session named ``session`` current (``%distrain use --session NAME``)."""
    refuse("workbench.use", earlier, {"name": "session"})
    if session is None:
        raise TypeError("workbench.use(session=NAME): name the session to make current")
    sess = KERNEL.get(session)
    KERNEL.current_name = session
    return sess


def start(
    n: int = 2,
    *,
    backend: str = "auto",
    launcher: str = "local",
    collective_timeout: float = 300.0,
    threads: int | None = None,
    launcher_options: dict | None = None,
    profile_dir: str | None = None,
    sys_path: tuple[str, ...] = (),
    ip: str | None = None,
    hosts: str | None = None,
    ssh_config: str | None = None,
    python: str | None = None,
    slurm=None,
    ray=None,
    progress=None,
    session: str | None = None,
    framework: str = "torch",
    nccl: str | None = None,
    nccl_preset: str | None = None,
    sync: tuple[str, ...] | list[str] | None = None,
    sync_limit: int | str | None = None,
    no_sync: bool = False,
    **earlier,
) -> RankSet:
    """Start ``n`` ranks and initialise their process group (blocks until ready).

    ``session``: a session of its own beside the others (default: the current session's
    name, or ``"default"``); the new set becomes current. ``collective_timeout``: seconds a
    collective on the ranks may take before torch raises. ``launcher="slurm"`` with
    ``slurm=SlurmRequest(...)`` submits one job; ``"ssh"`` with ``hosts="a:2,b:2"``
    spans hosts; ``"ray"`` with ``ray=RayRequest(address=..., cpus_per_rank=...)`` places
    the ranks in a Ray cluster's placement group. ``nccl="ALGO=Ring,PROTO=Simple"`` /
    ``nccl_preset="ib"``: NCCL settings every rank sets before its process group starts
    (checked here first). ``progress(line)`` gets live lines while waiting (``queued: job N
    PENDING (Reason)``); ``stop()`` from another thread, or Ctrl-C, cancels a start that
    waits in the queue. ``framework="jax"``: the ranks initialise ``jax.distributed`` instead
    of ``torch.distributed`` (and never import torch). ``sync``: the folders whose files reach the
    ranks' other hosts (default the working folder; ssh, slurm, ray), files past ``sync_limit``
    (``"64M"``) not sent; ``no_sync=True`` sends none.
    """
    refuse("workbench.start", earlier, {"name": "session", "timeout": "collective_timeout"})
    name = session
    if name is not None and (not isinstance(name, str) or not name.isidentifier()):
        raise ValueError(f"a session name is a word of letters, digits and _ (like ddp or fsdp_tp), got {name!r}")
    config = RankSetConfig(
        n=n,
        backend=backend,
        launcher=launcher,
        timeout=collective_timeout,
        threads=threads,
        launcher_options=launcher_options or {},
        profile_dir=profile_dir,
        sys_path=tuple(sys_path),
        ip=ip,
        hosts=hosts,
        ssh_config=ssh_config,
        python=python,
        slurm=slurm,
        framework=framework,
        nccl_env=nccl_env(nccl, nccl_preset),
        ray=ray,
        sync=_sync_settings(sync, sync_limit, no_sync),
    )
    config.validate()
    if name is None:
        taken = KERNEL.current()
        name = taken.name if taken is not None and taken is not KERNEL.pinned else DEFAULT
        if taken is not None and taken.running:
            raise AlreadyRunning(
                f"{taken.rankset.world_size} ranks are already running: use `%distrain restart -n {n}` "
                "to replace them, `%distrain stop` first, or `--session NAME` for a second set beside them"
            )
    taken = KERNEL.by_name.get(name)
    if taken is not None and taken.running:
        raise AlreadyRunning(
            f"a rank set named {name!r} is already running ({taken.rankset.world_size} ranks): "
            f"pick another --session, or `%distrain stop --session {name}` first"
        )
    new = name not in KERNEL.by_name
    sess = KERNEL.add(name)
    try:
        return _launch(sess, config, progress)
    except BaseException:
        if new and KERNEL.by_name.get(name) is sess and sess.rankset is None:
            del KERNEL.by_name[name]  # a start that failed leaves the sessions as they were
        raise


def _sync_settings(sync, sync_limit, no_sync: bool) -> SyncSettings:
    """``sync=``, ``sync_limit=``, ``no_sync=`` as the rank set's settings (checked by its config)."""
    if isinstance(sync, str):
        sync = (sync,)
    limit = DEFAULT_LIMIT if sync_limit is None else parse_size(sync_limit)
    return SyncSettings(paths=tuple(sync) if sync is not None else None, limit=limit, off=bool(no_sync))


def _launch(sess: Session, config: RankSetConfig, progress=None) -> RankSet:
    """Start ``config``'s ranks for ``sess`` and make it current."""
    previous = (KERNEL.pinned, KERNEL.current_name)
    KERNEL.make_current(sess)  # stop() from another thread cancels a start queued meanwhile

    def created(rs):
        sess.ranks.starting = rs
        rs.on_queue = lambda js: [fn(rs, js) for fn in KERNEL.listeners["queued"]]

    try:
        rs = RankSet.start(config, progress=progress, on_created=created)
    except BaseException:
        KERNEL.pinned, KERNEL.current_name = previous
        if sess.ranks.starting is not None:
            for fn in KERNEL.listeners["abandoned"]:
                try:
                    fn(sess.ranks.starting)
                except Exception:
                    pass
        raise
    finally:
        sess.ranks.starting = None
    sess.ranks.rankset = rs
    for fn in KERNEL.listeners["started"]:
        fn(rs)
    return rs


def stop(session: str | None = None, **earlier) -> list[int]:
    """Stop the current session's ranks (or those of the session named ``session``); the others keep
    running. Returns pids that could not be ended (normally none)."""
    refuse("workbench.stop", earlier, {"name": "session"})
    sess = KERNEL.current() if session is None else KERNEL.get(session)
    return _stop_session(sess)


def _stop_session(sess: Session | None) -> list[int]:
    if sess is None:
        return []
    if sess.ranks.starting is not None:  # still starting (queued): cancel the job, stop what started
        sess.ranks.starting.cancel()
    rs = sess.rankset
    if rs is None:
        return []
    for fn in KERNEL.listeners["stopping"]:
        try:
            fn(rs)
        except Exception:
            pass
    sess.ranks.rankset = None
    return rs.stop()


def hold(sess: Session, rankset: RankSet) -> None:
    """``rankset``, running and handed over from another process (``attach``, a keeper), is
    ``sess``'s now; it becomes current."""
    sess.ranks.rankset = rankset
    KERNEL.make_current(sess)


def let_go(sess: Session) -> None:
    """This process holds ``sess``'s set no more (another one does): forgotten here, not stopped."""
    sess.ranks.rankset = None
    KERNEL.forget(sess)


def restart(
    n: int | None = None,
    *,
    session: str | None = None,
    backend: str | None = None,
    collective_timeout: float | None = None,
    hosts: str | None = None,
    of: Session | None = None,
    **earlier,
) -> RankSet:
    """Stop the ranks (dead or alive) and start a new set with the same settings, or ``n`` ranks.

    ``session``: the session to restart (default the current one); ``of``: that session itself
    (a recovery names its own). ``hosts``: ssh hosts to start on (default the same, less lost ones).
    ``workbench.restart(n, load=...)`` (:mod:`.restart`) also repeats the setup and loads a checkpoint.
    """
    refuse("workbench.restart", earlier, {"timeout": "collective_timeout"})
    if session is not None:
        of = KERNEL.get(session)
    sess = of if of is not None else KERNEL.current()
    if sess is None or sess.rankset is None:
        raise NotRunning("there is nothing to restart: start ranks with `%distrain start -n 2`")
    import dataclasses

    config = sess.rankset.config
    overrides = {"backend": backend, "timeout": collective_timeout, "hosts": hosts}
    changes = {k: v for k, v in overrides.items() if v is not None}
    if n is not None:
        changes["n"] = n
    if "hosts" not in changes:
        changes.update(_without_lost_hosts(sess.rankset, n))
    config = dataclasses.replace(config, **changes)
    config.validate()
    _stop_session(sess)
    return _launch(sess, config)


def _without_lost_hosts(rs: RankSet, n: int | None) -> dict:
    """SSH ranks on a lost host (``RankSet.lost_hosts``): restart on the hosts left, every
    rank they hold (or ``n``); asking ssh to reach a lost host would fail the restart."""
    from .cluster import ssh

    lost = rs.lost_entries()
    if not lost:
        return {}
    hosts, room = ssh.remaining_hosts(rs.config.hosts, lost, n)
    gone = ", ".join(sorted(lost))
    if room == 0:
        raise ValueError(f"every host of --hosts {rs.config.hosts} is lost ({gone}): start anew with hosts that answer")
    if n is not None and room < n:
        raise ValueError(
            f"-n {n}: the hosts left after losing {gone} hold {room} ranks ({hosts}); give -n {room} or less"
        )
    return {"hosts": hosts, "n": room}


def status() -> list[dict]:
    """One dict per rank: rank, host, pid, device, memory, state (idle/busy/dead/stopped)."""
    return current().status()


def run(
    code: str,
    ranks=None,
    timeout: float | None = None,
    *,
    display: bool = True,
    stream: bool | None = None,
    grace: float = GRACE_S,
    session: str | None = None,
    group: bool | None = None,
    output: int | None = output_cut.DEFAULT_LIMIT,
    **earlier,
):
    """Run a cell on the ranks; output per rank in rank order (see ``cluster.cell``).

    ``timeout``: seconds to wait before the cell is reported stuck (the ranks go on running it).
    ``grace``: when a rank fails while others still run, the seconds they get to
    finish before they are interrupted (0: at once). ``session``: the session to run on
    (default the current one), without making it current. ``group``: True shows
    identical output of several ranks once under ``[ranks 0-13,15]``, False one block
    per rank; None groups past ``cluster.grouping.GROUP_PAST`` ranks. ``output``: about the
    most characters of printed output shown, all ranks together (a head and a tail of each
    rank's, and what was cut; None: all); every line is in the ranks' logs (``logs``).
    """
    refuse("workbench.run", earlier, {"on": "session"})
    if grace is None or grace < 0:
        raise ValueError(f"grace must be 0 or more seconds, got {grace!r}")
    if output is not None and (isinstance(output, bool) or not isinstance(output, int) or output <= 0):
        raise ValueError(f"output must be a number of characters (> 0) or None for all of it, got {output!r}")
    rs = current() if session is None else running_set(session)
    ahead = None
    if getattr(rs, "code_sync", None) is not None:  # the notebook's edits on the other hosts first
        ahead = code_sync.before_cell(rs, ranks=ranks, display=display)
    try:
        return run_cell(
            rs,
            code,
            ranks=ranks,
            timeout=timeout,
            display=display,
            stream=stream,
            grace=grace,
            group=group,
            output=output,
        )
    finally:
        if ahead is not None:  # an edit the ranks took just before the cell: what it did
            code_sync.after_cell(ahead)


def running_set(name: str) -> RankSet:
    """The running rank set of the session ``name`` (it stays not current)."""
    sess = KERNEL.get(name)
    if not sess.running:
        raise NotRunning(
            f"the rank set {name!r} is not running: `%distrain start -n 2 --session {name}`" + _others(name)
        )
    return sess.rankset


def sync(session: str | None = None) -> code_sync.SyncReport | None:
    """Send the edits of the synced folders to the other hosts now and reload what the ranks
    imported from them (``%distrain sync``); None where no host is synced."""
    rs = current() if session is None else running_set(session)
    if rs.code_sync is None or not rs.code_sync.active:
        return None
    return rs.code_sync.update(rs) or code_sync.SyncReport()


def apply(fn, *args, ranks=None, **kwargs) -> list:
    """Call a function on the ranks; results in rank order."""
    return current().apply(fn, *args, ranks=ranks, **kwargs)


def push(namespace: dict, ranks=None) -> None:
    """Copy variables from the notebook to the ranks."""
    current().push(namespace, ranks=ranks)


def pull(name: str, ranks=None) -> list:
    """Fetch a variable from the ranks, one value per rank, in rank order."""
    return current().pull(name, ranks=ranks)


def _stop_at_exit() -> None:
    for name in list(KERNEL.by_name):
        try:
            stop(name)
        except Exception:
            pass


atexit.register(_stop_at_exit)
