"""The runs a session supervises: one contract (:class:`Run`), its kinds side by side, and the
session's run part, which only this package changes.

Kinds: :mod:`.trainer` (the workbench trainer, with its optional step watchdog), :mod:`.budget`
(a failure budget: restart, set up, load, train on), :mod:`.fault_tolerant` (torchft replica
groups). Each can be carried to a keeper by ``detach`` through the contract (:func:`carry`,
:func:`take`). "Restart, repeat the setup, load the newest verified checkpoint" is
:func:`.resume.restart_from_checkpoint`, written once.
"""

from __future__ import annotations

from .contract import ENDED, KINDS, CannotCarry, Run, describe, register, summary
from .part import adopt, begin, carry, carry_refusal, current, note_hang, recovering, take

__all__ = [
    "ENDED",
    "KINDS",
    "CannotCarry",
    "Run",
    "adopt",
    "begin",
    "carry",
    "carry_refusal",
    "current",
    "describe",
    "note_hang",
    "recovering",
    "register",
    "summary",
    "take",
]

# the kinds register themselves (the keeper rebuilds a carried run by its kind's name)
from . import budget, fault_tolerant, trainer  # noqa: E402, F401
