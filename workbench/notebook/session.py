"""One notebook session per rank set, and the named sessions of this kernel.

A :class:`Session` is made of named parts, each changed only by the module that owns it (its
``OWNER``): a field assigned from several modules has no one place that says what it means.
Others read parts freely and change them by calling the owner (tests/unit/test_session_owners.py
counts writes from anywhere else). The API and magics act on the current session (``%distrain
use --session NAME``) or on one named per call (``--session NAME``)."""

from __future__ import annotations

import os

from ..shared.errors import WorkbenchError

DEFAULT = "default"  # the name of a set started without --session


class UnknownSession(WorkbenchError, KeyError):
    """No session has that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class Part:
    """A named part of a session: plain fields, assigned only in the module ``OWNER`` (or a module
    of that package); ``__slots__`` makes a misspelt or retired field an error, not a new one."""

    OWNER = ""
    __slots__ = ()

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__)
        return f"<{type(self).__name__} {fields}>"


class Ranks(Part):
    """The rank set, and a start still in progress (a Slurm job in the queue: ``stop()`` cancels it)."""

    OWNER = "workbench.notebook.api"
    __slots__ = ("rankset", "starting")

    def __init__(self, rankset=None) -> None:
        self.rankset = rankset
        self.starting = None


class Stream(Part):
    """The running set's event collector, the set it listens to, and the store it fills (still
    readable after the set stopped)."""

    OWNER = "workbench.notebook.stream"
    __slots__ = ("collector", "listening_to", "store")

    def __init__(self) -> None:
        self.collector = None
        self.listening_to = None
        self.store = None


class Runs(Part):
    """The current run (a :class:`~workbench.notebook.runs.Run`), where each run's latest start
    begins in the store's status events (``marks``), the id of the latest start (its events may
    not be here yet), step-timeout diagnoses (newest last), and whether a restart under way
    continues a run (its store and dashboard carry over)."""

    OWNER = "workbench.notebook.runs"
    __slots__ = ("current", "marks", "started", "hangs", "recovering")

    def __init__(self) -> None:
        self.current = None
        self.marks: dict[str, int] = {}
        self.started: str | None = None
        self.hangs: list[dict] = []
        self.recovering = False


class Setup(Part):
    """What a restart repeats to build the model again: the teaching trainer's recipe (``train
    setup``) and the code or function given to ``resume``/``--setup`` (the newest of the two wins)."""

    OWNER = "workbench.notebook.setup_recipe"
    __slots__ = ("recipe", "given")

    def __init__(self) -> None:
        self.recipe: dict | None = None
        self.given = None


class Checkpoints(Part):
    """Auto-save settings (applied again after a restart), the folder ``ckpt dir`` set here, and
    whether the checkpoints go to a sub-folder of the session's name (a named session's do)."""

    OWNER = "workbench.notebook.checkpoints"
    __slots__ = ("autosave", "root", "own_folder")

    def __init__(self, own_folder: bool = False) -> None:
        self.autosave: dict | None = None
        self.root: str | None = None
        self.own_folder = own_folder


class Trackers(Part):
    """Tracker kind -> the open :class:`~workbench.notebook.trackers.Tracker` mirroring the stream."""

    OWNER = "workbench.notebook.trackers"
    __slots__ = ("by_kind",)

    def __init__(self) -> None:
        self.by_kind: dict = {}


class Dashboard(Part):
    """The live dashboard (one per session)."""

    OWNER = "workbench.notebook.dashboard"
    __slots__ = ("live",)

    def __init__(self) -> None:
        self.live = None


class Handoff(Part):
    """What the latest detach/attach could not carry into this process, a line each."""

    OWNER = "workbench.notebook.handoff"
    __slots__ = ("notes",)

    def __init__(self) -> None:
        self.notes: list[str] = []


PARTS = {
    "ranks": Ranks,
    "stream": Stream,
    "runs": Runs,
    "setup": Setup,
    "checkpoints": Checkpoints,
    "trackers": Trackers,
    "dashboard": Dashboard,
    "handoff": Handoff,
}


def _part(name: str):
    return property(lambda self: getattr(self, "_" + name), doc=PARTS[name].__doc__)


class Session:
    """One rank set and the notebook's state about it, in parts (see the module docstring)."""

    __slots__ = ("name", *("_" + p for p in PARTS))

    ranks = _part("ranks")
    stream = _part("stream")
    runs = _part("runs")
    setup = _part("setup")
    checkpoints = _part("checkpoints")
    trackers = _part("trackers")
    dashboard = _part("dashboard")
    handoff = _part("handoff")

    def __init__(self, name: str, rankset=None, *, own_folder: bool = False) -> None:
        self.name = name
        self._ranks = Ranks(rankset)
        self._stream = Stream()
        self._runs = Runs()
        self._setup = Setup()
        self._checkpoints = Checkpoints(own_folder)
        self._trackers = Trackers()
        self._dashboard = Dashboard()
        self._handoff = Handoff()

    # what users read most, without naming the part
    @property
    def rankset(self):
        return self._ranks.rankset

    @property
    def running(self) -> bool:
        rs = self._ranks.rankset
        return rs is not None and rs.running

    @property
    def store(self):
        """The event store of the session's stream (None before any)."""
        return self._stream.store

    @property
    def hangs(self) -> list[dict]:
        """Step-timeout diagnoses (``train start --step-timeout``), newest last."""
        return list(self._runs.hangs)

    @property
    def recoveries(self) -> list[dict]:
        """What the failure budget did (``train start --max-failures``), oldest first."""
        return list(self.store.recoveries) if self.store is not None else []

    @property
    def checkpoint_dir(self) -> str:
        """This session's checkpoints folder: ``ckpt dir`` if set here, else the kernel's
        default folder, with a sub-folder per named session so two sets never mix steps."""
        if self._checkpoints.root:
            return self._checkpoints.root
        from ..shared.checkpoint import catalog

        base = catalog.default_dir()
        return os.path.join(base, self.name) if self._checkpoints.own_folder else base

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
        """The session ``name``, made when new; a named one keeps its checkpoints in a sub-folder."""
        sess = self.by_name.get(name)
        if sess is None:
            sess = self.by_name[name] = Session(name, own_folder=name != DEFAULT)
        return sess

    def forget(self, sess: Session) -> None:
        """``sess`` is no longer this kernel's (handed to another process, or a start that failed)."""
        if self.by_name.get(sess.name) is sess:
            del self.by_name[sess.name]
        if self.current_name == sess.name:
            self.current_name = None

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
