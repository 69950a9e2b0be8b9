"""How a rank's trainer announces itself to the rank's other parts (auto-save, checkpoints).

The trainer calls these; the checkpoint side subscribes. Neither imports the other, so a
trainer knows nothing of checkpoints and checkpoints never reach into a trainer's
internals. Listeners run on the thread named in each method; one that raises is reported
by the trainer like a step hook.
"""

from __future__ import annotations

import threading


class TrainerListener:
    """Subclass and override what you need (each is a no-op here)."""

    def trainer_built(self, trainer) -> None:
        """A new trainer is this rank's current one (the thread that built it)."""

    def step_begun(self, trainer, step: int) -> None:
        """Step ``step`` (1-based) is about to run (training thread)."""

    def step_ended(self, trainer, record: dict) -> None:
        """A step ended; ``record`` is its metrics (``step``, ``loss``, ...) (training thread)."""

    def state_changed(self, trainer, state: str, reason: str) -> None:
        """``running``, ``paused``, ``stopped``, ``finished`` or ``error`` (training thread)."""


_LISTENERS: tuple[TrainerListener, ...] = ()
_LOCK = threading.Lock()
_TRAINER = None  # the newest trainer announced on this rank


def subscribe(listener: TrainerListener) -> None:
    global _LISTENERS
    with _LOCK:
        if listener not in _LISTENERS:
            _LISTENERS = (*_LISTENERS, listener)


def unsubscribe(listener: TrainerListener) -> None:
    global _LISTENERS
    with _LOCK:
        _LISTENERS = tuple(x for x in _LISTENERS if x is not listener)


def listeners() -> tuple[TrainerListener, ...]:
    return _LISTENERS


def current_trainer():
    """This rank's newest trainer, or None."""
    return _TRAINER


def forget_trainer() -> None:
    """No trainer on this rank any more (tests, a rank set handed back clean)."""
    global _TRAINER
    _TRAINER = None


def trainer_built(trainer) -> None:
    global _TRAINER
    _TRAINER = trainer
    for x in _LISTENERS:
        x.trainer_built(trainer)


def step_begun(trainer, step: int) -> None:
    for x in _LISTENERS:
        x.step_begun(trainer, step)


def step_ended(trainer, record: dict) -> None:
    for x in _LISTENERS:
        x.step_ended(trainer, record)


def state_changed(trainer, state: str, reason: str) -> None:
    for x in _LISTENERS:
        x.state_changed(trainer, state, reason)
