"""Exceptions raised on the notebook side; each says what happened and what to do next."""

from __future__ import annotations


class WorkbenchError(RuntimeError):
    """Base class. IPython shows only the message (no notebook-side traceback)."""

    def _render_traceback_(self) -> list[str]:  # IPython hook: a short message, not a stack
        return [f"{type(self).__name__}: {self}"]


class NotRunning(WorkbenchError):
    """An operation needs ranks and none are running."""


class AlreadyRunning(WorkbenchError):
    """``start`` was asked for while a rank set is up."""


class RankFailure(WorkbenchError):
    """Code raised on one or more ranks; ``failures`` maps rank -> (ename, evalue, traceback)."""

    def __init__(self, message: str, failures: dict[int, tuple[str, str, str]] | None = None):
        super().__init__(message)
        self.failures = failures or {}

    @property
    def ranks(self) -> list[int]:
        return sorted(self.failures)


class RankDied(WorkbenchError):
    """A rank process exited while the rank set was in use."""

    def __init__(self, message: str, deaths: list[dict] | None = None):
        super().__init__(message)
        self.deaths = deaths or []


class CellTimeout(WorkbenchError):
    """A cell ran past its ``--timeout``; ``diagnosis`` holds each stuck rank's stack, ``culprit``
    the conclusion the message leads with (who waits in which collective, for whom)."""

    def __init__(self, message: str, diagnosis: dict | None = None, culprit=None):
        super().__init__(message)
        self.diagnosis = diagnosis or {}
        self.culprit = culprit


class Interrupted(WorkbenchError):
    """The user interrupted a cell; the ranks were interrupted too."""


class BadRanks(WorkbenchError, ValueError):
    """A rank selection names ranks that do not exist or cannot be parsed."""


class BudgetSpent(WorkbenchError, RuntimeError):
    """A run failed more often than ``--max-failures`` allows; the message is the summary."""


class Refused(WorkbenchError, ValueError):
    """A training call that cannot be done as asked (``workbench.train.start``, ``train start``...); nothing was
    started or changed, and the message says what would work."""
