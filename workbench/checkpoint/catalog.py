"""Which checkpoints exist in a folder: list, resolve ``latest|STEP|TAG``, delete, retention.

Pure Python (no torch): usable from the notebook without ranks. Only folders with a
valid ``manifest.json`` and no ``.tmp-``/``.old-`` mark are checkpoints; ``latest`` is
the most recently *completed* one (manifest time), whatever its step.
"""
from __future__ import annotations

import os
import shutil
import time
import uuid

from .manifest import MANIFEST, OLD_MARK, TMP_MARK, Manifest, ManifestError, is_temp, read_manifest

__all__ = ["DEFAULT_DIR", "default_dir", "set_default_dir", "entries", "resolve", "list_checkpoints",
           "delete", "apply_retention", "clean_temp", "NoCheckpoint"]

DEFAULT_DIR = "checkpoints"
_default: str | None = None


class NoCheckpoint(FileNotFoundError):
    """No checkpoint matches what was asked for."""


def default_dir() -> str:
    """The checkpoint folder: set by ``%distrain ckpt dir PATH``, else ``./checkpoints`` (absolute)."""
    return os.path.abspath(_default or DEFAULT_DIR)


def set_default_dir(path: str) -> str:
    global _default
    _default = os.path.abspath(os.path.expanduser(path))
    return _default


def entries(root: str) -> list[tuple[str, Manifest]]:
    """(folder, manifest) of every complete checkpoint under ``root``, oldest first."""
    out = []
    if not os.path.isdir(root):
        return out
    for name in os.listdir(root):
        folder = os.path.join(root, name)
        if is_temp(name) or not os.path.isdir(folder) or not os.path.exists(os.path.join(folder, MANIFEST)):
            continue
        try:
            m = read_manifest(folder)
        except ManifestError:
            continue
        out.append((folder, m))
    out.sort(key=lambda e: (e[1].time, e[1].step))
    return out


def resolve(root: str, which: str | int | None = "latest") -> tuple[str, Manifest]:
    """The checkpoint ``which`` names: ``latest``, a step number, a tag or a folder name."""
    found = entries(root)
    if not found:
        raise NoCheckpoint(f"no complete checkpoint in {root}: save one with `%distrain ckpt save`")
    which = "latest" if which in (None, "") else str(which)
    if which == "latest":
        return found[-1]
    if which.isdigit():
        hits = [e for e in found if e[1].step == int(which)]
    else:
        hits = [e for e in found if e[1].tag == which or os.path.basename(e[0]) == which]
    if not hits:
        avail = ", ".join(f"{os.path.basename(f)} (step {m.step})" for f, m in found[-8:])
        raise NoCheckpoint(f"no checkpoint {which!r} in {root}; there are: {avail}")
    return hits[-1]


def list_checkpoints(root: str):
    """A DataFrame (one row per checkpoint, oldest first); a list of dicts without pandas."""
    rows = []
    found = entries(root)
    for i, (folder, m) in enumerate(found):
        rows.append({
            "name": os.path.basename(folder), "step": m.step,
            "time": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.time)),
            "world_size": m.world_size, "strategy": m.strategy, "loss": m.loss,
            "size_mb": round(m.bytes / 2**20, 3), "tag": m.tag or "", "auto": m.auto,
            "latest": i == len(found) - 1,
        })
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        return rows
    cols = ["name", "step", "time", "world_size", "strategy", "loss", "size_mb", "tag", "auto", "latest"]
    return pd.DataFrame(rows, columns=cols)


def _remove(folder: str) -> None:
    """Rename out of sight first, then delete: a half-deleted folder is never a checkpoint."""
    trash = f"{folder}{OLD_MARK}{uuid.uuid4().hex[:8]}"
    os.replace(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)


def delete(root: str, which: list[str]) -> list[str]:
    """Delete the named checkpoints (``latest``, steps, tags or names); returns folder names."""
    folders = []
    for w in which:
        folder, _ = resolve(root, w)
        if folder not in folders:
            folders.append(folder)
    for f in folders:
        _remove(f)
    return [os.path.basename(f) for f in folders]


def apply_retention(root: str, keep: int, *, protect: str | None = None) -> list[str]:
    """Keep the ``keep`` newest auto-saves; tagged/manual checkpoints are never removed."""
    if keep is None or keep < 1:
        return []
    autos = [(f, m) for f, m in entries(root) if m.auto and f != protect]
    extra = len(autos) + (1 if protect else 0) - keep
    removed = []
    for f, _ in autos[: max(0, extra)]:
        _remove(f)
        removed.append(os.path.basename(f))
    return removed


def clean_temp(root: str, *, keep: str | None = None, older_than: float = 0.0) -> list[str]:
    """Remove leftovers of interrupted saves (``*.tmp-*``) and deletions (``*.old-*``)."""
    removed = []
    if not os.path.isdir(root):
        return removed
    now = time.time()
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if not is_temp(name) or path == keep:
            continue
        try:
            if now - os.path.getmtime(path) < older_than:
                continue
        except OSError:
            continue
        shutil.rmtree(path, ignore_errors=True) if os.path.isdir(path) else os.remove(path)
        removed.append(name)
    return removed


def temp_name(final: str, token: int) -> str:
    return f"{final}{TMP_MARK}{token:012x}"
