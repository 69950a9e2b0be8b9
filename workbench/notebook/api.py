"""The Python API behind the magics: one current rank set per notebook kernel.

Everything ``%distrain`` does is a call here, so the same steps work from a script
or a plain Python cell: ``workbench.start(4)``, ``workbench.run("...")``,
``workbench.stop()``.
"""
from __future__ import annotations

import atexit

from .cluster import AlreadyRunning, NotRunning, RankSet, RankSetConfig
from .cluster.cell import GRACE_S, run_cell

_current: RankSet | None = None
_starting: RankSet | None = None  # a start in progress (a Slurm job in the queue): stop() cancels it
_hooks: dict[str, list] = {"started": [], "stopping": [], "check": []}


def on(event: str, fn) -> None:
    """Register ``fn(rankset)`` to run when a rank set has ``started`` or is ``stopping``.

    ``check`` functions run whenever the current set is asked for; one that returns a
    text (the ranks were ended from outside this kernel) makes the set stopped, with it.

    Other parts (telemetry stream, trainer control) attach to new rank sets this way
    instead of the rank set knowing about them.
    """
    _hooks[event].append(fn)


def current() -> RankSet:
    """The running rank set; a clear error where there is none."""
    for fn in _hooks["check"] if _current is not None and _current.running else ():
        note = fn(_current)
        if note:  # e.g. the Lab sidebar ended the ranks while this kernel was busy
            stop()
            raise NotRunning(f"the ranks were {note}; start them again with `%distrain start -n 2`")
    if _current is None or not _current.running:
        raise NotRunning("no ranks are running: start them with `%distrain start -n 2` "
                         "(or workbench.start(2))")
    return _current


def is_running() -> bool:
    return _current is not None and _current.running


def start(n: int = 2, *, backend: str = "auto", launcher: str = "local", timeout: float = 300.0,
          threads: int | None = None, launcher_options: dict | None = None,
          profile_dir: str | None = None, sys_path: tuple[str, ...] = (), ip: str | None = None,
          hosts: str | None = None, ssh_config: str | None = None, python: str | None = None,
          slurm=None, progress=None) -> RankSet:
    """Start ``n`` ranks and initialise their process group (blocks until ready).

    ``launcher="slurm"`` with ``slurm=SlurmRequest(...)`` submits one job; ``"ssh"`` with
    ``hosts="a:2,b:2"`` spans hosts. ``progress(line)`` gets live lines while waiting
    (``queued: job N PENDING (Reason)``); ``stop()`` from another thread, or Ctrl-C,
    cancels a start that waits in the queue.
    """
    global _current, _starting
    config = RankSetConfig(n=n, backend=backend, launcher=launcher, timeout=timeout, threads=threads,
                           launcher_options=launcher_options or {}, profile_dir=profile_dir,
                           sys_path=tuple(sys_path), ip=ip, hosts=hosts, ssh_config=ssh_config,
                           python=python, slurm=slurm)
    config.validate()
    if is_running():
        raise AlreadyRunning(
            f"{_current.world_size} ranks are already running: use `%distrain restart -n {n}` "
            "to replace them, or `%distrain stop` first"
        )

    def created(rs):
        global _starting
        _starting = rs

    try:
        _current = RankSet.start(config, progress=progress, on_created=created)
    finally:
        _starting = None
    for fn in _hooks["started"]:
        fn(_current)
    return _current


def stop() -> list[int]:
    """Stop the current ranks. Returns pids that could not be ended (normally none)."""
    global _current
    if _current is None:
        if _starting is not None:  # still starting (queued): cancel the job, stop what started
            _starting.cancel()
        return []
    rs, _current = _current, None
    for fn in _hooks["stopping"]:
        try:
            fn(rs)
        except Exception:
            pass
    return rs.stop()


def restart(n: int | None = None, **overrides) -> RankSet:
    """Stop the ranks (dead or alive) and start a new set with the same settings, or ``n`` ranks."""
    if _current is None:
        raise NotRunning("there is nothing to restart: start ranks with `%distrain start -n 2`")
    import dataclasses

    config = _current.config
    changes = {k: v for k, v in overrides.items() if v is not None}
    if n is not None:
        changes["n"] = n
    config = dataclasses.replace(config, **changes)
    config.validate()
    stop()
    return start(**{f.name: getattr(config, f.name) for f in dataclasses.fields(config)})


def status() -> list[dict]:
    """One dict per rank: rank, host, pid, device, memory, state (idle/busy/dead/stopped)."""
    return current().status()


def run(code: str, ranks=None, timeout: float | None = None, *, display: bool = True,
        stream: bool | None = None, grace: float = GRACE_S):
    """Run a cell on the ranks; output per rank in rank order (see ``cluster.cell``).

    ``grace``: when a rank fails while others still run, the seconds they get to
    finish before they are interrupted (0: at once).
    """
    if grace is None or grace < 0:
        raise ValueError(f"grace must be 0 or more seconds, got {grace!r}")
    return run_cell(current(), code, ranks=ranks, timeout=timeout, display=display, stream=stream,
                    grace=grace)


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
    try:
        stop()
    except Exception:
        pass


atexit.register(_stop_at_exit)
