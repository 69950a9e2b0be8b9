"""Rank-side glue between training and checkpoints: ``from workbench.engine import checkpoint_hooks``.

A rank says what it trains once::

    state = checkpoint_hooks.track(prepared)            # a workbench.strategies.Prepared
    for step in range(state.step, 100):                 # resumes where a load left off
        loss = prepared.train_step(batch_at(ds, 32, step, dp_rank=..., dp_size=...))
        checkpoint_hooks.step_done(loss)               # step += 1; runs auto-save

``%distrain ckpt save|load`` then call :func:`rank_save` / :func:`rank_load` on every
rank. :func:`autosave` makes a trainer step hook (``trainer.add_hook(fn)``) that saves
every N steps and keeps the newest K auto-saves.
"""
from __future__ import annotations

import math

from ..checkpoint import catalog
from ..checkpoint import load as _load
from ..checkpoint import save as _save
from ..checkpoint.state import Target, TrainState, target_from_prepared

__all__ = ["track", "target", "state", "step_done", "rank_save", "rank_load", "rank_wait", "autosave",
           "set_autosave", "TrainState", "untrack"]

_TARGET: Target | None = None
_AUTOSAVE = None  # the hook installed by set_autosave (called by step_done)


def track(prepared=None, *, model=None, optimizer=None, state: TrainState | None = None,
          strategy: str | None = None) -> TrainState:
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


def _from_trainer() -> Target | None:
    """Adapter: the trainer's model/optimizer/step where a trainer runs on this rank."""
    try:
        from . import trainer as tr  # written by the trainer's owner; optional
    except ImportError:
        return None
    get = getattr(tr, "current", None) or getattr(tr, "get_trainer", None)
    t = get() if callable(get) else getattr(tr, "TRAINER", None)
    prepared = getattr(t, "prepared", None) if t is not None else None
    if prepared is None:
        return None
    st = TrainState(step=int(getattr(t, "step", 0) or 0), loss=getattr(t, "last_loss", None))
    return target_from_prepared(prepared, st)


def target() -> Target:
    t = _TARGET or _from_trainer()
    if t is None:
        from . import runtime

        rank = runtime.context().rank if runtime._CONTEXT else 0
        raise RuntimeError(
            f"rank {rank}: nothing to checkpoint. On every rank, register the model first: "
            "`from workbench.engine import checkpoint_hooks; checkpoint_hooks.track(prepared)`"
        )
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


def rank_save(root: str | None = None, tag: str | None = None, async_: bool = False, keep: int | None = None,
              auto: bool = False, with_optimizer: bool = True) -> dict:
    """``%distrain ckpt save`` on one rank."""
    return _save.save(target(), root or catalog.default_dir(), tag=tag, async_=async_, keep=keep, auto=auto,
                      with_optimizer=with_optimizer)


def rank_load(folder: str, model_only: bool = False) -> dict:
    """``%distrain ckpt load`` on one rank (``folder`` resolved by the notebook)."""
    return _load.load(target(), folder, model_only=model_only)


def rank_wait(timeout: float | None = None) -> dict | None:
    return _save.wait(timeout)


def autosave(root: str, every: int, keep: int = 3, async_: bool = True):
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
        return _save.save(t, root, async_=async_, keep=keep, auto=True)

    hook.every, hook.keep, hook.root = every, keep, root
    return hook


def set_autosave(root: str | None, every: int | None, keep: int = 3, async_: bool = True):
    """Install (or with ``every=None`` remove) the auto-save hook run by :func:`step_done`."""
    global _AUTOSAVE
    _AUTOSAVE = None if not every else autosave(root or catalog.default_dir(), every, keep, async_)
    return _AUTOSAVE
