"""Notebook-side checkpoint API (what ``%distrain ckpt`` calls). Imports no torch.

Every collective step runs on all ranks through :meth:`RankSet.apply`; pure file
operations (list, delete, resolve) run here in the notebook.
"""
from __future__ import annotations

import builtins
import math
import os

from . import catalog

__all__ = ["save", "load", "list", "delete", "export", "wait", "autosave", "resume", "get_dir", "set_dir",
           "describe_save", "describe_load", "rollback_hint"]

_SETUP = None  # the setup code/function last given to resume()
_AUTOSAVE: dict | None = None  # last autosave settings (re-applied after resume)


def _on_rank(name: str, *args, **kwargs):
    """Runs on a rank: call ``workbench.engine.checkpoint_hooks.<name>``."""
    from workbench.engine import checkpoint_hooks

    return getattr(checkpoint_hooks, name)(*args, **kwargs)


def _next_version() -> int:
    """Runs on a rank: the trainer's next change version (1 where no trainer runs)."""
    from workbench.engine import trainer

    return trainer.current().next_version() if trainer._CURRENT is not None else 1


def _export_on_rank(folder: str, path: str, dtype):
    from workbench.checkpoint.export import export_safetensors

    return export_safetensors(folder, path, dtype=dtype)


def _rs(rankset=None):
    if rankset is not None:
        return rankset
    from .. import api

    return api.current()


def get_dir(root: str | None = None) -> str:
    return os.path.abspath(os.path.expanduser(root)) if root else catalog.default_dir()


def set_dir(path: str) -> str:
    return catalog.set_default_dir(path)


def save(tag: str | None = None, *, async_: bool = False, root: str | None = None, with_optimizer: bool = True,
         rankset=None) -> dict:
    """Checkpoint every rank's model, optimizer, step, data position and RNG into ``root``."""
    rs = _rs(rankset)
    from ..cluster import shared_dir

    shared_dir.require(rs, get_dir(root))  # ranks on several hosts: a folder they all share
    res = rs.apply(_on_rank, "rank_save", get_dir(root), tag, async_, None, False, with_optimizer)
    info = dict(res[0])
    info["blocked_s"] = max(r.get("blocked_s", 0.0) for r in res)
    return info


def wait(rankset=None) -> dict | None:
    """Wait until the background save (if any) is written and visible."""
    res = _rs(rankset).apply(_on_rank, "rank_wait")
    return res[0]


def load(which: str | int = "latest", *, root: str | None = None, model_only: bool = False, rankset=None) -> dict:
    """Load ``latest``, a step or a tag into the live ranks (any world size / strategy)."""
    rs = _rs(rankset)
    rs.apply(_on_rank, "rank_wait")  # a save in flight becomes visible first
    folder, _ = catalog.resolve(get_dir(root), which)
    res = rs.apply(_on_rank, "rank_load", folder, model_only)
    info = dict(res[0])
    info["notes"] = sorted({n for r in res for n in r.get("notes", [])})
    return info


def list(root: str | None = None):  # noqa: A001 - the sub-command's name
    """A DataFrame: name, step, time, world size, strategy, loss, size on disk, tag."""
    return catalog.list_checkpoints(get_dir(root))


def delete(which, *, root: str | None = None, keep: int | None = None, rankset=None) -> builtins.list[str]:
    """Delete checkpoints by name/step/tag, or keep only the newest ``keep`` auto-saves."""
    from .. import api

    if api.is_running() or rankset is not None:
        try:
            _rs(rankset).apply(_on_rank, "rank_wait")
        except Exception:
            pass
    root = get_dir(root)
    removed = catalog.delete(root, builtins.list(which)) if which else []
    if keep is not None:
        removed += catalog.apply_retention(root, keep)
    return removed


def export(path: str, which: str | int = "latest", *, root: str | None = None, dtype: str | None = None,
           rankset=None) -> dict:
    """Write one consolidated ``.safetensors`` of the model (on rank 0 when ranks run)."""
    from .. import api

    folder, _ = catalog.resolve(get_dir(root), which)
    path = os.path.abspath(path)
    if rankset is not None or api.is_running():
        return _rs(rankset).apply(_export_on_rank, folder, path, dtype, ranks=[0])[0]
    from .export import export_safetensors  # no ranks: in this process (imports torch)

    return export_safetensors(folder, path, dtype=dtype)


def autosave(every: int | None, *, keep: int = 3, async_: bool = True, root: str | None = None, rankset=None):
    """Save every ``every`` steps (from ``checkpoint_hooks.step_done`` or the trainer's hook)."""
    global _AUTOSAVE
    rs = _rs(rankset)
    _AUTOSAVE = None if not every else {"every": every, "keep": keep, "async_": async_, "root": get_dir(root)}
    if not every:
        rs.apply(_on_rank, "set_autosave", None, None)
    else:
        rs.apply(_on_rank, "set_autosave", get_dir(root), every, keep, async_)
    # on a trainer (running or not) the hook changes at one agreed step on every rank:
    # staged everywhere first, then committed (a new Trainer picks it up by itself)
    version = max(v for v in rs.apply(_next_version))
    if any(rs.apply(_on_rank, "attach_autosave_to_trainer", version)):
        rs.apply(_on_rank, "commit_trainer", version)
    return _AUTOSAVE


def resume(setup=None, which: str | int = "latest", *, n: int | None = None, root: str | None = None,
           **restart_options) -> dict:
    """Restart the ranks (dead or alive), rebuild the model with ``setup``, load ``which``.

    ``setup``: code (str) run on every rank as a cell, or a function called here in the
    notebook after the restart (e.g. ``lambda: workbench.training.setup("ddp")``); it
    must build the model on every rank (``checkpoint_hooks.track(...)``, a Trainer, or
    ``engine.prepare``). Remembered for the next resume. Without one, the latest
    ``workbench.training.setup`` (``train start --model ...``) is repeated.
    ``restart_options``: ``backend=``, ``timeout=`` for :func:`workbench.api.restart`.
    """
    global _SETUP
    from .. import api, training

    setup = setup if setup is not None else _SETUP or training.last_setup()
    if setup is None:
        raise ValueError("resume needs the setup that builds the model and calls checkpoint_hooks.track(...): "
                         "workbench.checkpoint.api.resume(setup_code) or `%distrain ckpt resume --setup VAR` "
                         "(or build the trainer with `%distrain train start --model tiny` first)")
    catalog.resolve(get_dir(root), which)  # refuse before restarting when there is nothing to load
    _SETUP = setup
    rs = api.restart(n, **restart_options)
    if isinstance(setup, str):
        api.run(setup, display=False)
    else:
        setup()
    if _AUTOSAVE:
        autosave(_AUTOSAVE["every"], keep=_AUTOSAVE["keep"], async_=_AUTOSAVE["async_"], root=_AUTOSAVE["root"])
    info = load(which, root=root)
    info["restarted"] = rs.world_size
    return info


def describe_save(info: dict) -> str:
    where = info.get("path", "")
    if info.get("async") and "save_s" not in info:
        return (f"saving {info['name']} (step {info['step']}) in the background; training was blocked "
                f"{info['blocked_s'] * 1000:.0f} ms. It becomes `latest` when complete ({where})")
    return f"saved {info['name']} (step {info['step']}) in {info.get('save_s', info.get('blocked_s', 0)):.2f} s to {where}"


def describe_load(info: dict) -> str:
    text = (f"loaded {info['name']} (step {info['step']}, loss {info['loss']}) saved as {info['from_strategy']} on "
            f"{info['from_world_size']} ranks into {info['strategy']} on {info['world_size']} ranks "
            f"in {info['load_s']:.2f} s")
    if info.get("model_only"):
        text += " (model only: fresh optimizer)"
    if info.get("notes"):
        text += "\n  " + "\n  ".join(info["notes"])
    return text


def rollback_hint(step: int, loss, root: str | None = None) -> str:
    """The message shown when training pauses on a NaN/Inf/spiking loss."""
    what = "NaN/Inf" if loss is None or (isinstance(loss, float) and not math.isfinite(loss)) else f"a spike ({loss:.4g})"
    try:
        folder, m = catalog.resolve(get_dir(root), "latest")
        good = f"`%distrain ckpt load latest` rolls back to {os.path.basename(folder)} (step {m.step}, loss {m.loss})"
    except catalog.NoCheckpoint:
        good = "there is no checkpoint to roll back to (`%distrain ckpt autosave --every N` keeps one)"
    return f"training paused at step {step}: the loss is {what}. {good}; then lower the learning rate and resume."
