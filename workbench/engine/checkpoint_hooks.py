"""Rank-side glue between training and checkpoints: ``from workbench.engine import checkpoint_hooks``.

A rank's loop says once what it trains (``state = checkpoint_hooks.track(prepared)``) and
calls ``checkpoint_hooks.step_done(loss)`` after each step; ``%distrain ckpt save|load`` then
call :func:`rank_save` / :func:`rank_load` on every rank. :func:`autosave` saves every N steps
and keeps the newest K; on a trainer it runs as a :class:`~.listeners.TrainerListener`, so
this module never imports the trainer."""

from __future__ import annotations

import math
import threading

from ..shared.checkpoint import catalog
from ..shared.checkpoint.integrity import DamagedCheckpoint
from . import listeners
from .checkpoint import load as _load
from .checkpoint import save as _save
from .checkpoint.state import Target, TrainState, target_from_prepared

__all__ = [
    "track",
    "target",
    "state",
    "step_done",
    "rank_save",
    "rank_load",
    "rank_verify",
    "rank_wait",
    "autosave",
    "set_autosave",
    "TrainState",
    "untrack",
    "LAST_AUTOSAVE",
]

_TARGET: Target | None = None
_AUTOSAVE = None  # the hook installed by set_autosave (called by step_done)


def track(
    prepared=None, *, model=None, optimizer=None, state: TrainState | None = None, strategy: str | None = None
) -> TrainState:
    """Register what this rank trains; returns the :class:`TrainState` a load updates."""
    global _TARGET
    if prepared is not None:
        t = target_from_prepared(prepared, state)
    elif model is not None:
        t = Target(model=model, optimizer=optimizer, state=state or TrainState(), strategy=strategy or "none")
    else:
        raise ValueError("track(prepared) or track(model=..., optimizer=...)")
    if strategy:
        t.strategy = strategy
    _TARGET = t
    return t.state


def untrack() -> None:
    global _TARGET
    _TARGET = None


def _trainer():
    """This rank's newest trainer, or None."""
    return listeners.current_trainer()


def _trainer_for(t: Target | None):
    tr = _trainer()
    if tr is None:
        return None
    if t is None or tr.model is t.model or tr.optimizer is t.optimizer:
        return tr
    return None


def _from_trainer() -> Target | None:
    """Adapter: a Target for the trainer's model/optimizer where a trainer runs on this rank."""
    tr = _trainer()
    if tr is None:
        try:
            from . import session
        except ImportError:
            return None
        if session.has_prepared():  # laid out with engine.prepare but no trainer (yet)
            return target_from_prepared(session.prepared(), TrainState())
        return None
    if tr.prepared is not None:
        return target_from_prepared(tr.prepared, TrainState())
    return Target(model=tr.model, optimizer=tr.optimizer, state=TrainState(), strategy="none")


def _sync_from_trainer(t: Target) -> None:
    """Step, loss and data position as the trainer has them (the trainer counts steps)."""
    tr = _trainer_for(t)
    if tr is None:
        return
    t.state.step = int(tr.step)
    loss = (tr.last or {}).get("loss")
    t.state.loss = float(loss) if loss is not None else t.state.loss
    t.state.data = tr.data_state()


def _sync_to_trainer(t: Target) -> str | None:
    """After a load: the trainer continues from the checkpoint's step and data position, with
    a fresh loss window; returns a note where the data cannot continue exactly."""
    tr = _trainer_for(t)
    if tr is None:
        return None
    return tr.restore_position(t.state.step, t.state.data, t.state.loss)


class _PausedTrainer(listeners.TrainerListener):
    """Pause a running trainer at a step boundary (on every rank) for a save or load: asks
    for the pause, then waits to hear the trainer leave "running"."""

    def __init__(self, t: Target, timeout: float = 120.0):
        self.tr = _trainer_for(t)
        self.timeout = timeout
        self.resume = False
        self._left_running = threading.Event()

    def state_changed(self, trainer, state: str, reason: str) -> None:
        if trainer is self.tr and state != "running":
            self._left_running.set()

    def __enter__(self):
        tr = self.tr
        if tr is None or tr.state != "running" or not tr.looping:
            return self
        if tr.on_training_thread():
            return self  # called from the training thread itself (a step hook): already between steps
        listeners.subscribe(self)
        try:
            tr.pause("checkpoint")
            self.resume = True
            if tr.state == "running" and tr.looping and not self._left_running.wait(self.timeout):
                raise TimeoutError(f"rank {tr.rank}: the trainer did not pause within {self.timeout} s")
        finally:
            listeners.unsubscribe(self)
        return self

    def __exit__(self, *exc):
        if self.resume and self.tr.state == "paused":
            self.tr.resume()
        return False


def target() -> Target:
    t = _TARGET or _from_trainer()
    if t is None:
        from . import runtime

        rank = runtime.context().rank if runtime._CONTEXT else 0
        raise RuntimeError(
            f"rank {rank}: nothing to checkpoint. On every rank, register the model first: "
            "`from workbench.engine import checkpoint_hooks; checkpoint_hooks.track(prepared)` "
            "(or build a Trainer)"
        )
    _sync_from_trainer(t)
    return t


def state() -> TrainState:
    return target().state


def step_done(loss=None, *, data: dict | None = None) -> dict | None:
    """Record one finished step (step += 1, loss, data position) and run the auto-save hook."""
    t = target()
    t.state.step += 1
    if loss is not None:
        t.state.loss = float(loss)
    if data is not None:
        t.state.data = dict(data)
    if _AUTOSAVE is not None:
        return _AUTOSAVE({"step": t.state.step, "loss": t.state.loss})
    return None


def rank_save(
    root: str | None = None,
    tag: str | None = None,
    async_: bool = False,
    keep: int | None = None,
    auto: bool = False,
    with_optimizer: bool = True,
) -> dict:
    """``%distrain ckpt save`` on one rank (a running trainer is paused at a step boundary meanwhile)."""
    t = target()
    with _PausedTrainer(t):
        _sync_from_trainer(t)
        return _save.save(
            t,
            root or catalog.default_dir(),
            tag=tag,
            async_=async_,
            keep=keep,
            auto=auto,
            with_optimizer=with_optimizer,
        )


def rank_load(folder: str, model_only: bool = False) -> dict:
    """``%distrain ckpt load`` on one rank (``folder`` resolved by the notebook).

    A damaged checkpoint is returned as ``{"damaged": [problem dicts]}`` (the same on every
    rank, nothing loaded) for the notebook to name it with the newest good one.
    """
    t = target()
    with _PausedTrainer(t):
        try:
            info = _load.load(t, folder, model_only=model_only)
        except DamagedCheckpoint as exc:
            return {"damaged": [p.to_dict() for p in exc.problems], "path": folder}
        note = _sync_to_trainer(t)
    if note:
        info["notes"] = [*info.get("notes", []), note]
    return info


def rank_verify(folder: str) -> list[dict]:
    """``%distrain ckpt verify`` on one rank: the problems found by all ranks, each file checked
    by the rank that reads it (collective)."""
    _save.wait()
    return [p.to_dict() for p in _load.verify(folder, _save.ckpt_group())]


def rank_wait(timeout: float | None = None) -> dict | None:
    return _save.wait(timeout)


def autosave(root: str, every: int, keep: int = 3, async_: bool = False):
    """A step hook ``fn(record)``: save every ``every`` steps, keep the newest ``keep`` auto-saves.

    ``record`` is the trainer's step record (``{"step": n, "loss": x, ...}``, ``step`` =
    steps completed). A non-finite loss is not saved (the last good checkpoint stays latest).
    """
    if every < 1:
        raise ValueError(f"every={every} must be >= 1")

    def hook(record: dict):
        step = int(record.get("step", 0))
        loss = record.get("loss")
        t = target()
        t.state.step = step
        if loss is not None:
            t.state.loss = float(loss)
        if step % every or (loss is not None and not math.isfinite(float(loss))):
            return None
        tr = _trainer_for(t)
        if tr is not None and tr.pausing:
            return None  # the trainer is pausing on a spike/NaN: keep the last good one as latest
        # the steps up to this one reach the notebook before the checkpoint exists: a recovery
        # loads it and redoes only later steps, so a rank killed with step events still queued
        # would otherwise leave steps before the checkpoint missing from the metrics for good
        from . import publisher

        publisher.flush(5.0)
        return _save.save(t, root, async_=async_, keep=keep, auto=True, report=_report_autosave)

    hook.every, hook.keep, hook.root = every, keep, root
    return hook


AUTOSAVE_FAILED = "auto-save failed"  # how the dashboard tells a failure from a success
LAST_AUTOSAVE: dict = {}  # the latest auto-save's outcome on this rank ({"name", "step", "failed"?})


def _report_autosave(info: dict) -> None:
    """An auto-save ended: remember it, and (rank 0) tell the notebook's dashboard; a failed one
    does not stop training (the error is in ``info["failed"]``, the same on every rank)."""
    from ..shared import events
    from . import publisher, runtime

    LAST_AUTOSAVE.clear()
    LAST_AUTOSAVE.update(info)
    rank = runtime.context().rank if runtime._CONTEXT else 0
    if rank != 0:
        return
    tr = _trainer()
    text = (
        f"{AUTOSAVE_FAILED} at step {info['step']} (training goes on): {info['failed']}"
        if info.get("failed")
        else f"auto-save: saved {info['name']} (step {info['step']})"
    )
    publisher.emit(events.log_event(run=getattr(tr, "run", None) or "checkpoints", rank=rank, text=text))


def set_autosave(root: str | None, every: int | None, keep: int = 3, async_: bool = False):
    """Install (or with ``every=None`` remove) the auto-save hook run by :func:`step_done`."""
    global _AUTOSAVE
    _AUTOSAVE = None if not every else autosave(root or catalog.default_dir(), every, keep, async_)
    return _AUTOSAVE


class AutoSaver(listeners.TrainerListener):
    """Runs the installed auto-save hook after the steps of the trainer it follows; a new
    trainer takes over the hook installed at the time it is built."""

    def __init__(self):
        self.trainer = None  # the trainer whose steps it saves
        self.hook = None  # the auto-save hook on it (None: no auto-save)

    def trainer_built(self, trainer) -> None:
        self.trainer, self.hook = trainer, _AUTOSAVE

    def step_ended(self, trainer, record: dict) -> None:
        hook = self.hook
        if hook is not None and trainer is self.trainer and int(record.get("step", 0)) % hook.every == 0:
            hook(record)

    def swap(self, hook):
        """A staged change (:mod:`.staging`): follow ``hook`` from the committed step on."""

        def change(trainer) -> None:
            self.trainer, self.hook = trainer, hook

        return change


AUTOSAVER = AutoSaver()
listeners.subscribe(AUTOSAVER)


def stage_autosave(version: int) -> bool:
    """Stage the installed auto-save hook (or none) on this rank's trainer under ``version``:
    it replaces the earlier one when the notebook commits ``version``, at the same step on
    every rank. True when a trainer runs here."""
    t = _trainer()
    if t is None:
        return False
    t.stage_call(version, AUTOSAVER.swap(_AUTOSAVE))
    return True
