"""The run contract: what every kind of run the notebook supervises answers, and the registry of kinds.

A session holds one current run (``session.runs.current``); ``train status``, ``train wait``,
the dashboard's status line, the Lab sidebar and ``attach`` read it through this contract
only, so a new kind of run is one class here and no branch anywhere else (as Lightning Fabric
keeps its strategies behind one ABC). A kind also says how it travels to another process
(``detach``): :meth:`Run.to_state` there, :meth:`Run.from_state` in the taker.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from ...shared.errors import WorkbenchError

ENDED = ("finished", "stopped", "error")  # the trainer's states after which nothing of a start goes on


class CannotCarry(WorkbenchError):
    """A run that cannot move to another process as it is; nothing was changed."""


class Run(ABC):
    """One run of a session's ranks.

    ``wait`` returning True means finished is final: nothing of the run still works on any
    rank (its threads have ended, its last events were sent and its auto-save written), so the
    next ``train start`` meets ranks that are free.
    """

    kind: ClassVar[str] = ""  # the registry's key, and how status texts name the kind
    controls: ClassVar[tuple[str, ...]] = ("pause", "resume", "set", "inject")  # trainer controls it takes
    cannot_carry: ClassVar[str] = ""  # why this kind cannot move to a keeper while it runs ("" : it can)

    sess = None  # the session it belongs to
    rankset = None  # the ranks it runs on (a recovery moves it to a new set)
    run_id: str = ""
    started_as: str = ""  # the line ``train start`` printed for it (set by whoever started it)

    @property
    def run(self) -> str:
        """The run id, as ``workbench.train.fault_tolerant(...).run`` and the stream name it."""
        return self.run_id

    @property
    @abstractmethod
    def state(self) -> str:
        """Where the run is: running, paused, recovering, finished, stopped, error, gave up, closed..."""

    @property
    @abstractmethod
    def records(self) -> list[dict]:
        """What happened to it: hang reports, recoveries or replacements, oldest first."""

    @abstractmethod
    def status_text(self) -> str:
        """What ``train status`` prints: a head line, then a line per record."""

    @abstractmethod
    def wait(self, timeout: float | None = None) -> bool:
        """True once the run has ended and nothing of it works on any rank (or it was closed)."""

    @abstractmethod
    def stop(self) -> str:
        """End the run on every rank at one step; returns what was asked, in one line."""

    @abstractmethod
    def close(self) -> None:
        """Stop watching it (a new run, the set handed on); changes nothing on the ranks."""

    def to_state(self) -> dict | None:
        """Stop watching here and return what another process needs to watch on (plain data), or
        None when there is nothing to go on with (the run has ended). Raises :class:`CannotCarry`."""
        if self.cannot_carry and not self.wait(0):
            raise CannotCarry(self.cannot_carry)
        self.close()
        return None

    @classmethod
    def from_state(cls, sess, state: dict) -> Run:
        """The run :meth:`to_state` described, watched from this process for ``sess``."""
        raise CannotCarry(f"a {cls.kind} run cannot be taken over from another process")

    @classmethod
    def describe(cls, record: dict) -> str:
        """One line of one of this kind's records (the dashboard and ``train status`` show them)."""
        return str(record)

    def rank_status(self) -> list[dict]:
        """What each rank of the session's running set says of its trainer (``train status``'s
        table); [] where no set runs."""
        from ...engine import rpc

        rs = self.sess.rankset if self.sess is not None else None
        if rs is None or not rs.running:
            return []
        rows = rs.apply(rpc.handle, rpc.TrainerStatus())
        return [{"rank": i, **r.to_dict()} for i, r in enumerate(rows)]

    def _changed(self) -> None:
        """Its state changed: the set's Lab registry entry shows it (the sidebar reads it there)."""
        try:
            from .. import registry

            registry.note_run(self.rankset, summary(self))
        except Exception:  # the sidebar is a convenience: never fail a run over it
            pass

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.run_id}: {self.state}>"


KINDS: dict[str, type[Run]] = {}


def register(cls: type[Run]) -> type[Run]:
    """Add a kind of run; a second kind under a name already taken is refused."""
    if not cls.kind:
        raise TypeError(f"{cls.__qualname__} names no kind")
    have = KINDS.get(cls.kind)
    if have is not None and (have.__module__, have.__qualname__) != (cls.__module__, cls.__qualname__):
        raise TypeError(
            f"two kinds of run named {cls.kind!r}: {have.__module__}.{have.__qualname__} and "
            f"{cls.__module__}.{cls.__qualname__}"
        )
    KINDS[cls.kind] = cls
    return cls


def summary(run: Run | None) -> dict | None:
    """The run in plain data (the Lab registry entry's ``run``): id, kind, state, head line."""
    if run is None:
        return None
    return {"id": run.run_id, "kind": run.kind, "state": run.state, "text": run.status_text().splitlines()[0]}


def describe(record: dict) -> str:
    """One line of a record of any kind (each record names the kind that made it)."""
    cls = KINDS.get(record.get("run_kind", ""))
    return cls.describe(record) if cls is not None else str(record)
