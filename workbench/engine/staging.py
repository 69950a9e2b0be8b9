"""Two-phase changes to a running trainer, the same step on every rank.

A change (new hyperparameters, an auto-save hook on or off) must take effect at one step on
every rank, or one rank would save alone and wait for the others forever: the notebook
stages it on every rank under a new version (a refusal anywhere commits nothing), then
commits; the trainer agrees on the highest committed version with its step flags. Plain
Python (no torch), so the notebook can import :func:`change_on_ranks`."""

from __future__ import annotations

import threading
from collections.abc import Callable

Change = Callable[[object], None]  # fn(trainer), run on the training thread at the agreed step


class Staging:
    """Changes staged by version on one rank, the highest committed version, and those applied."""

    def __init__(self, owner: str = "rank"):
        self._owner = owner
        self._lock = threading.Lock()
        self._staged: dict[int, list[Change]] = {}
        self._committed = 0
        self._applied = 0

    @property
    def committed(self) -> int:
        with self._lock:
            return self._committed

    def next_version(self) -> int:
        """A version not used yet on this rank (the notebook takes the max over ranks)."""
        with self._lock:
            return max([self._committed, self._applied, *self._staged]) + 1

    def stage(self, version: int, change: Change) -> None:
        with self._lock:
            self._staged.setdefault(int(version), []).append(change)

    def commit(self, version: int) -> None:
        with self._lock:
            self._committed = max(self._committed, int(version))

    def due(self, version: int) -> list[Change]:
        """The changes of every version up to ``version`` not applied yet, in order; a version
        committed but never staged here is an error (the ranks would diverge silently)."""
        changes: list[Change] = []
        while self._applied < version:
            with self._lock:
                self._applied += 1
                staged = self._staged.pop(self._applied, None)
            if staged is None:
                raise RuntimeError(f"{self._owner}: change v{self._applied} was committed but never staged here")
            changes.extend(staged)
        return changes


_CURRENT: Staging | None = None  # the newest trainer's


def install(staging: Staging) -> None:
    global _CURRENT
    _CURRENT = staging


def next_version() -> int:
    """Runs on a rank: the next change version (1 where no trainer runs)."""
    return _CURRENT.next_version() if _CURRENT is not None else 1


def commit(version: int) -> bool:
    """Runs on a rank: commit ``version`` on the newest trainer; False where none runs."""
    if _CURRENT is None:
        return False
    _CURRENT.commit(version)
    return True


def change_on_ranks(rankset, stage_on_rank, *args):
    """In the notebook: ``stage_on_rank(version, *args)`` on every rank under one new version,
    then commit it where any rank staged something (a truthy reply). Returns the replies; an
    error on any rank while staging propagates and commits nothing."""
    version = max(rankset.apply(next_version))
    replies = rankset.apply(stage_on_rank, version, *args)
    if any(replies):
        rankset.apply(commit, version)
    return replies
