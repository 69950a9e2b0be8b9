"""One notebook session per rank set, and the named sessions of this kernel.

A :class:`Session` holds everything the notebook keeps about one rank set: the set, its
event stream and store, dashboard, step watchdog, setup recipe, auto-save settings,
checkpoints folder and hang reports. Several named sessions may run side by side
(``%distrain start -n 2 --session ddp``); the API and magics act on the current one
(``%distrain use --session NAME``), or on one named per call (``--session NAME``).
"""

from __future__ import annotations

import os

from ..shared.errors import WorkbenchError

DEFAULT = "default"  # the name of a set started without --session


class UnknownSession(WorkbenchError, KeyError):
    """No session has that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Session:
    """One rank set and the notebook's state about it (see the module docstring)."""

    def __init__(self, name: str, rankset=None) -> None:
        self.name = name
        self.rankset = rankset
        self.starting = None  # a start in progress (a Slurm job in the queue): stop() cancels it
        self.collector = None  # the event stream of the running set (stream.attach)
        self.collector_of = None  # the rank set that collector listens to
        self.store = None  # its event store, still readable after the set stopped
        self.dashboard = None  # the live dashboard (one per session)
        self.watchdog = None  # the StepWatchdog of the latest `train start --step-timeout`
        self.setup_recipe: dict | None = None  # the latest training.setup(), repeated by `resume`
        self.resume_setup = None  # the setup code/function last given to restart(load=..., setup=...)
        self.autosave: dict | None = None  # auto-save settings, re-applied after resume
        self.checkpoint_root: str | None = None  # set by `ckpt dir` in this session
        self.own_folder = False  # a named set: its checkpoints go to a sub-folder of its name
        self.marks: dict[str, int] = {}  # run -> index of the first status event of its latest start
        self.started_run: str | None = None  # run id of the latest start (its events may not be here yet)
        self.hangs: list[dict] = []  # step-timeout diagnoses, newest last
        self.supervisor = None  # the recovery.Supervisor of the latest `train start --max-failures`
        self.recovering = False  # a supervisor restarts the set: its store and dashboard carry over
        self.fault_tolerant = None  # the fault_tolerance.FaultTolerantRun of the latest `train start --fault-tolerant`
        self.trackers: dict = {}  # tracker name -> trackers.Tracker mirroring this session's stream
        self.handoff_notes: list[str] = []  # what the latest detach/attach could not carry into this process

    @property
    def running(self) -> bool:
        return self.rankset is not None and self.rankset.running

    @property
    def recoveries(self) -> list[dict]:
        """What the failure budget's supervisor did (``train start --max-failures``), oldest first."""
        return list(self.store.recoveries) if self.store is not None else []

    @property
    def checkpoint_dir(self) -> str:
        """This session's checkpoints folder: ``ckpt dir`` if set here, else the kernel's
        default folder, with a sub-folder per named session so two sets never mix steps."""
        if self.checkpoint_root:
            return self.checkpoint_root
        from ..shared.checkpoint import catalog

        base = catalog.default_dir()
        return os.path.join(base, self.name) if self.own_folder else base

    def __repr__(self) -> str:
        state = f"{self.rankset.world_size} ranks, running" if self.running else "stopped"
        return f"<Session {self.name!r}: {state}>"


class Sessions:
    """The sessions of this kernel by name, which is current, and who listens for starts/stops."""

    def __init__(self) -> None:
        self.by_name: dict[str, Session] = {}
        self.current_name: str | None = None
        self.pinned: Session | None = None  # a set made outside start(), current for a while (`using`)
        self.loose: dict[int, Session] = {}  # sessions of rank sets made outside start() (tests, scripts)
        self.listeners: dict[str, list] = {"started": [], "stopping": [], "check": [], "queued": [], "abandoned": []}
        self.overlays: dict[tuple[str, ...], object] = {}  # live dashboards of several sessions, by names

    def current(self) -> Session | None:
        if self.pinned is not None:
            return self.pinned
        return self.by_name.get(self.current_name) if self.current_name else None

    def make_current(self, sess: Session) -> None:
        if sess is not self.pinned:
            self.pinned = None
            self.current_name = sess.name

    def get(self, name: str) -> Session:
        if name not in self.by_name:
            have = ", ".join(self.by_name) or "none yet"
            raise UnknownSession(
                f"there is no rank set named {name!r}; the sessions are: {have} "
                f"(start one with `%distrain start -n 2 --session {name}`)"
            )
        return self.by_name[name]

    def add(self, name: str) -> Session:
        sess = self.by_name.get(name)
        if sess is None:
            sess = self.by_name[name] = Session(name)
        return sess

    def of(self, rankset) -> Session:
        """The session holding ``rankset``; one is made for a set started some other way."""
        for sess in self.by_name.values():
            if sess.rankset is rankset:
                return sess
        if self.pinned is not None and self.pinned.rankset is rankset:
            return self.pinned
        sess = self.loose.get(id(rankset))
        if sess is None or sess.rankset is not rankset:
            sess = self.loose[id(rankset)] = Session(f"rankset_{id(rankset):x}", rankset)
        return sess

    def running(self) -> list[str]:
        return [n for n, s in self.by_name.items() if s.running]


KERNEL = Sessions()


def current() -> Session | None:
    """The current session (None before any start)."""
    return KERNEL.current()


def of(rankset) -> Session:
    return KERNEL.of(rankset)


class using:
    """``with using(rankset):`` makes a rank set started outside :func:`api.start` (a test's
    shared set, a script's) the current one for the block, or with ``None`` none; what was
    current before comes back after. The named sessions are left as they are."""

    def __init__(self, rankset) -> None:
        self.rankset = rankset

    def __enter__(self):
        self.previous = (KERNEL.pinned, KERNEL.current_name)
        if self.rankset is None:
            KERNEL.pinned, KERNEL.current_name = None, None
            return None
        KERNEL.pinned = KERNEL.of(self.rankset)
        return KERNEL.pinned

    def __exit__(self, *exc) -> None:
        KERNEL.pinned, KERNEL.current_name = self.previous


class named(using):
    """``with named("ddp"):`` the session ``ddp`` is the current one for the block (what
    ``--session NAME`` does for one command); an unknown name raises :class:`UnknownSession` here."""

    def __init__(self, name: str) -> None:
        self.sess = KERNEL.get(name)

    def __enter__(self):
        self.previous = (KERNEL.pinned, KERNEL.current_name)
        KERNEL.pinned = self.sess
        return self.sess
