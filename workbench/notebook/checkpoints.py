"""Notebook-side checkpoint API (what ``%distrain ckpt`` calls). Imports no torch.

Every collective step runs on all ranks through :meth:`RankSet.apply`; pure file
operations (list, delete, resolve) run here in the notebook. Owns the session's
``checkpoints`` part (its folder and auto-save settings).
"""

from __future__ import annotations

import builtins
import math
import os

from ..engine import rpc
from ..shared import replies
from ..shared.checkpoint import catalog
from ..shared.checkpoint.integrity import DamagedCheckpoint, Problem, describe_problems

__all__ = [
    "save",
    "load",
    "list",
    "delete",
    "export",
    "wait",
    "autosave",
    "get_dir",
    "set_dir",
    "describe_save",
    "describe_load",
    "rollback_hint",
    "verify",
    "describe_verify",
    "NoGoodCheckpoint",
    "SaveFailed",
    "LoadFailed",
]


def _rs(rankset=None):
    if rankset is not None:
        return rankset
    from . import api

    return api.current()


def get_dir(root: str | None = None) -> str:
    """``root``, else the current session's checkpoints folder (each named set its own)."""
    if root:
        return os.path.abspath(os.path.expanduser(root))
    from . import session

    sess = session.current()
    return sess.checkpoint_dir if sess is not None else catalog.default_dir()


def set_dir(path: str) -> str:
    """The checkpoints folder of the current session (of the kernel before any start)."""
    from . import session

    sess = session.current()
    if sess is None:
        return catalog.set_default_dir(path)
    sess.checkpoints.root = os.path.abspath(os.path.expanduser(path))
    return sess.checkpoints.root


def save(
    tag: str | None = None, *, async_: bool = False, root: str | None = None, with_optimizer: bool = True, rankset=None
) -> dict:
    """Checkpoint every rank's model, optimizer, step, data position and RNG into ``root``."""
    rs = _rs(rankset)
    from .cluster import shared_dir

    shared_dir.require(rs, get_dir(root))  # ranks on several hosts: a folder they all share
    res = _storage_errors_once(
        rs.submit(
            rpc.handle, rpc.SaveCheckpoint(root=get_dir(root), tag=tag, async_=async_, with_optimizer=with_optimizer)
        )
    )
    info = res[0].to_dict()
    info["blocked_s"] = max(r.blocked_s or 0.0 for r in res)
    return info


def wait(rankset=None) -> dict | None:
    """Wait until the background save (if any) is written and visible."""
    res = _storage_errors_once(_rs(rankset).submit(rpc.handle, rpc.WaitForSave()))
    return None if res[0] is None else res[0].to_dict()


class SaveFailed(RuntimeError):
    """The storage refused a save (no space, read-only, a folder not shared by all ranks):
    the same cause on every rank, said once; nothing of the checkpoint was kept."""


class LoadFailed(RuntimeError):
    """A rank could not read its part of a checkpoint; no rank applied anything."""


_SAID_ONCE = {"StorageError": SaveFailed, "LoadFailed": LoadFailed}


def _storage_errors_once(call) -> builtins.list:
    """The call's results; an error every rank raises alike (a storage fault, a failed read)
    becomes one :class:`SaveFailed` / :class:`LoadFailed`, said once instead of per rank."""
    from .cluster import RankFailure

    try:
        return call.result()
    except RankFailure as exc:
        names = {ename for ename, _, _ in exc.failures.values()}
        if len(names) == 1 and next(iter(names)) in _SAID_ONCE:
            raise _SAID_ONCE[next(iter(names))](exc.failures[min(exc.failures)][1]) from None
        raise


def load(
    which: str | int = "latest",
    *,
    root: str | None = None,
    model_only: bool = False,
    rankset=None,
    skip_damaged: bool = False,
    at_most: int | None = None,
) -> dict:
    """Load ``latest``, a step or a tag into the live ranks (any world size / strategy).

    All or nothing: the ranks verify the files first and apply nothing unless every rank has
    read its part. A damaged checkpoint raises :class:`DamagedCheckpoint` naming each bad
    file, the rank that reads it, what is wrong and the newest good checkpoint; with
    ``skip_damaged`` (``restart --load``, the NaN rollback) the newest good one is loaded instead
    and ``info["skipped"]`` says what was passed over. ``at_most`` (with ``latest``): the
    newest good checkpoint of that step or an earlier one (a recovery's, see ``recovery``).
    """
    rs = _rs(rankset)
    rs.apply(rpc.handle, rpc.WaitForSave())  # a save in flight becomes visible first
    root = get_dir(root)
    skipped: builtins.list[str] = []
    folder = None
    try:
        if at_most is None:
            folder, _ = catalog.resolve(root, which)
    except DamagedCheckpoint as exc:
        if not skip_damaged:
            raise
        skipped.append(_skip_text(exc.folder, exc.problems))
    tried = set()
    while True:
        if folder is None:
            rest = [
                f
                for f, m in reversed(catalog.entries(root))
                if f not in tried and (at_most is None or m.step <= at_most)
            ]
            if not rest:
                raise NoGoodCheckpoint(f"no good checkpoint in {root} to load: " + "; ".join(skipped))
            folder = rest[0]
        res = _load_on_ranks(rs, folder, model_only)
        if res[0].info is not None:
            break
        problems = builtins.list(res[0].damaged)
        if not skip_damaged:
            alt = catalog.newest_good(root, verify=lambda f: _verify_on_ranks(rs, f), exclude=(folder,))
            raise DamagedCheckpoint(folder, problems, alternative=alt, root=root)
        skipped.append(_skip_text(folder, problems))
        tried.add(folder)
        folder = None
    info = res[0].info.to_dict()
    info["notes"] = sorted({n for r in res for n in r.info.notes})
    info["skipped"] = skipped
    info["staging_bytes"] = max(r.info.staging_bytes for r in res)
    return info


class NoGoodCheckpoint(catalog.NoCheckpoint):
    """Every checkpoint that could be loaded is damaged."""


def _skip_text(folder: str, problems) -> str:
    return f"skipped {os.path.basename(folder)}: damaged ({'; '.join(p.text() for p in problems[:3])})"


def _load_on_ranks(rs, folder: str, model_only: bool) -> builtins.list[replies.LoadReply]:
    from .cluster import RankDied

    try:
        return _storage_errors_once(rs.submit(rpc.handle, rpc.LoadCheckpoint(folder=folder, model_only=model_only)))
    except RankDied as exc:
        raise RankDied(
            f"{exc}\nThe load of {os.path.basename(folder)} did not complete. The checkpoint is applied only once "
            "every rank has read its part, so each surviving rank holds either its old state or the whole "
            "checkpoint, never a mix; but the ranks no longer form a group: a restart is needed "
            "(`%distrain restart --load`).",
            deaths=exc.deaths,
        ) from None


def _verify_on_ranks(rs, folder: str) -> builtins.list[Problem]:
    return builtins.list(rs.apply(rpc.handle, rpc.VerifyCheckpoint(folder=folder))[0].problems)


def verify(which: str | int = "latest", *, root: str | None = None, rankset=None) -> dict:
    """Check a checkpoint's files (sizes, checksums) without loading it: on the ranks when they
    run (each file by the rank that reads it), else here. ``problems`` empty: it is good."""
    import time

    from . import api

    root = get_dir(root)
    t0 = time.perf_counter()
    try:
        folder, m = catalog.resolve(root, which)
    except DamagedCheckpoint as exc:
        return {
            "name": os.path.basename(exc.folder),
            "path": exc.folder,
            "problems": exc.problems,
            "alternative": exc.alternative,
            "root": root,
        }
    if rankset is not None or api.is_running():
        rs = _rs(rankset)
        problems, by = _verify_on_ranks(rs, folder), rs.world_size
    else:
        problems, by = catalog.verify_local(folder), 0
    out = {
        "name": os.path.basename(folder),
        "path": folder,
        "problems": problems,
        "root": root,
        "files": len(m.integrity or m.files),
        "bytes": m.bytes,
        "checksums": bool(m.integrity),
        "ranks": by,
        "verify_s": time.perf_counter() - t0,
    }
    if problems:
        out["alternative"] = catalog.newest_good(root, exclude=(folder,))
    return out


def describe_verify(info: dict) -> str:
    if info["problems"]:
        return describe_problems(
            info["path"], info["problems"], alternative=info.get("alternative"), root=info["root"]
        ).replace(", nothing was loaded", "")
    what = "sizes and checksums" if info["checksums"] else "sizes (saved without checksums)"
    where = f"by {info['ranks']} ranks" if info["ranks"] else "in the notebook (no ranks running)"
    return (
        f"{info['name']}: good: {info['files']} files, {info['bytes'] / 2**20:.2f} MiB, {what} checked "
        f"{where} in {info['verify_s']:.2f} s"
    )


def list(root: str | None = None):  # noqa: A001 - the sub-command's name
    """A DataFrame: name, step, time, world size, strategy, loss, size on disk, tag."""
    return catalog.list_checkpoints(get_dir(root))


def delete(which, *, root: str | None = None, keep: int | None = None, rankset=None) -> builtins.list[str]:
    """Delete checkpoints by name/step/tag, or keep only the newest ``keep`` auto-saves."""
    from . import api

    if api.is_running() or rankset is not None:
        try:
            _rs(rankset).apply(rpc.handle, rpc.WaitForSave())
        except Exception:
            pass
    root = get_dir(root)
    removed = catalog.delete(root, builtins.list(which)) if which else []
    if keep is not None:
        removed += catalog.apply_retention(root, keep)
    return removed


def export(
    path: str,
    which: str | int = "latest",
    *,
    root: str | None = None,
    dtype: str | None = None,
    hf: bool = False,
    merged: bool = False,
    rankset=None,
) -> dict:
    """Write one consolidated ``.safetensors`` of the model (on rank 0 when ranks run); with
    ``hf=True`` a folder ``path`` that ``transformers``' ``from_pretrained`` loads (config.json +
    model.safetensors under the Hugging Face names), from a checkpoint of a transformers model.
    A peft adapter's checkpoint exports as peft's adapter folder (adapter_config.json +
    adapter_model.safetensors) with ``hf=True``, or merged into its saved base with ``merged=True``."""
    from . import api

    folder, m = catalog.resolve(get_dir(root), which)
    if merged and not m.adapter:
        raise ValueError(
            f"checkpoint {m.name} holds a whole model, not a peft adapter: --merged is for adapter "
            "checkpoints; export it with `%distrain ckpt export DIR --hf`"
        )
    if hf and not m.model_config and not m.adapter:  # an adapter's export needs no model config
        raise ValueError(
            f"checkpoint {m.name} keeps no Hugging Face config: the model saved was not a transformers "
            "model. Export plain safetensors instead: `%distrain ckpt export PATH.safetensors`"
        )
    if m.adapter and not (hf or merged):
        raise ValueError(
            f"checkpoint {m.name} holds a peft adapter (its trainable tensors only): export it with "
            "`--hf` (peft's adapter folder) or `--merged` (the base with the adapter merged in)"
        )
    path = os.path.abspath(path)
    request = rpc.ExportWeights(
        folder=folder, path=path, dtype=dtype, hf=hf, merged=merged, adapter=bool(m.adapter) and hf and not merged
    )
    if rankset is not None or api.is_running():
        reply = _rs(rankset).apply(rpc.handle, request, ranks=[0])[0]
    else:  # no ranks: in this process (imports torch)
        reply = request.run()
    return reply.to_dict()


def autosave(every: int | None, *, keep: int = 3, async_: bool = False, root: str | None = None, rankset=None):
    """Save every ``every`` steps (from ``checkpoint_hooks.step_done`` or the trainer's hook); each save
    is written before training goes on unless ``async_`` (as :func:`save`)."""
    from . import session

    rs = _rs(rankset)
    sess = session.of(rs)
    sess.checkpoints.autosave = (
        None if not every else {"every": every, "keep": keep, "async_": async_, "root": get_dir(root)}
    )
    if not every:
        rs.apply(rpc.handle, rpc.SetAutosave())
    else:
        rs.apply(rpc.handle, rpc.SetAutosave(root=get_dir(root), every=every, keep=keep, async_=async_))
    # on a trainer (running or not) the hook changes at one agreed step on every rank:
    # staged everywhere first, then committed (a new Trainer picks it up by itself)
    version = max(r.version for r in rs.apply(rpc.handle, rpc.NextVersion()))
    if any(r.staged for r in rs.apply(rpc.handle, rpc.StageAutosave(version=version))):
        rs.apply(rpc.handle, rpc.CommitTrainer(version=version))
    return sess.checkpoints.autosave


def autosave_again(sess, rankset) -> None:
    """The session's auto-save on its new ranks (a restart), as it was set."""
    again = sess.checkpoints.autosave
    if again:
        autosave(again["every"], keep=again["keep"], async_=again["async_"], root=again["root"], rankset=rankset)


def forget_autosave(sess) -> None:
    """The session saves no more by itself (its ranks' hook was removed, or they are gone)."""
    sess.checkpoints.autosave = None


def carry(sess) -> dict:
    """The checkpoints part as it travels to another process (``detach``)."""
    return {"autosave": sess.checkpoints.autosave, "root": sess.checkpoints.root}


def take(sess, carried: dict) -> None:
    sess.checkpoints.autosave = carried["autosave"]
    sess.checkpoints.root = carried["root"]


def resume(*args, **kwargs):
    """Refused: ``workbench.restart(n, load=..., setup=...)`` is the one way back from a checkpoint."""
    raise TypeError(
        "workbench.ckpt.resume(...) is now workbench.restart(n, load='latest', setup=..., dir=...) "
        "(`%distrain restart --load`); nothing was done"
    )


def describe_save(info: dict) -> str:
    where = info.get("path", "")
    if info.get("async") and "save_s" not in info:
        return (
            f"saving {info['name']} (step {info['step']}) in the background; training was blocked "
            f"{info['blocked_s'] * 1000:.0f} ms. It becomes `latest` when complete ({where})"
        )
    return (
        f"saved {info['name']} (step {info['step']}) in {info.get('save_s', info.get('blocked_s', 0)):.2f} s to {where}"
    )


def describe_load(info: dict) -> str:
    text = (
        f"loaded {info['name']} (step {info['step']}, loss {info['loss']}) saved as {info['from_strategy']} on "
        f"{info['from_world_size']} ranks into {info['strategy']} on {info['world_size']} ranks "
        f"in {info['load_s']:.2f} s"
    )
    if info.get("model_only"):
        text += " (model only: fresh optimizer)"
    if info.get("notes") or info.get("skipped"):
        text += "\n  " + "\n  ".join([*info.get("skipped", []), *info.get("notes", [])])
    return text


def rollback_hint(step: int, loss, root: str | None = None) -> str:
    """The message shown when training pauses on a NaN/Inf/spiking loss."""
    what = (
        "NaN/Inf" if loss is None or (isinstance(loss, float) and not math.isfinite(loss)) else f"a spike ({loss:.4g})"
    )
    root = get_dir(root)
    found = catalog.entries(root)
    skipped = []
    good = None
    for folder, m in reversed(found):  # the newest checkpoint whose files are whole
        problems = catalog.verify_local(folder)
        if not problems:
            good = (folder, m)
            break
        skipped.append(_skip_text(folder, problems))
    broken = [b for b in catalog.damaged_folders(root) if not good or b[1] > good[1].time]
    skipped = [_skip_text(f, [p]) for f, _, p in broken] + skipped
    if good is None:
        text = "there is no good checkpoint to roll back to (`%distrain ckpt autosave --every N` keeps one)"
    else:
        folder, m = good
        name = os.path.basename(folder)
        which = "latest" if not skipped and folder == found[-1][0] else name
        text = f"`%distrain ckpt load {which}` rolls back to {name} (step {m.step}, loss {m.loss})"
    if skipped:
        text += " (" + "; ".join(skipped) + ")"
    return f"training paused at step {step}: the loss is {what}. {text}; then lower the learning rate and resume."
