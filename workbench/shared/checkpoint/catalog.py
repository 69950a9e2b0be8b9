"""Which checkpoints exist in a folder: list, resolve ``latest|STEP|TAG``, delete, retention.

Pure Python (no torch): usable from the notebook without ranks. Only folders with a
valid ``manifest.json`` and no ``.tmp-``/``.old-`` mark are checkpoints; ``latest`` is
the most recently *completed* one (manifest time), whatever its step. A folder that
holds checkpoint files but no valid manifest (deleted, half-copied) is a *damaged*
checkpoint: :func:`resolve` refuses it by name, or as ``latest`` when it is the newest,
rather than silently loading an older one.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid

from . import integrity
from .integrity import DamagedCheckpoint
from .manifest import MANIFEST, OLD_MARK, TMP_MARK, Manifest, ManifestError, is_temp, read_manifest

__all__ = [
    "DEFAULT_DIR",
    "default_dir",
    "set_default_dir",
    "entries",
    "resolve",
    "list_checkpoints",
    "delete",
    "apply_retention",
    "clean_temp",
    "NoCheckpoint",
    "damaged_folders",
    "newest_good",
    "status",
]

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


def _looks_like_checkpoint(folder: str) -> bool:
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return any(
        n == ".metadata" or n.endswith(".distcp") or (n.startswith("rank-") and n.endswith(".json")) for n in names
    )


def damaged_folders(root: str) -> list[tuple[str, float, integrity.Problem]]:
    """(folder, newest file time, problem) of folders with checkpoint files but no valid manifest."""
    out = []
    if not os.path.isdir(root):
        return out
    for name in os.listdir(root):
        folder = os.path.join(root, name)
        if is_temp(name) or not os.path.isdir(folder) or not _looks_like_checkpoint(folder):
            continue
        p = integrity.manifest_problem(folder)
        if p is None:
            try:
                read_manifest(folder)
                continue
            except ManifestError as exc:
                p = integrity.Problem(MANIFEST, 0, "manifest", str(exc))
        t = max((os.path.getmtime(os.path.join(folder, n)) for n in os.listdir(folder)), default=0.0)
        out.append((folder, t, p))
    return out


def resolve(root: str, which: str | int | None = "latest") -> tuple[str, Manifest]:
    """The checkpoint ``which`` names: ``latest``, a step number, a tag or a folder name.

    A named folder without a valid manifest, or one newer than every complete checkpoint
    when ``latest`` is asked for, raises :class:`DamagedCheckpoint` naming the newest
    complete one instead.
    """
    found = entries(root)
    which = "latest" if which in (None, "") else str(which)
    broken = damaged_folders(root)
    named = [b for b in broken if os.path.basename(b[0]) == which]
    if which == "latest" and broken:
        newest = max(broken, key=lambda b: b[1])
        if not found or newest[1] > found[-1][1].time:
            named = [newest]
    if named:
        good = newest_good(root)
        raise DamagedCheckpoint(named[0][0], [named[0][2]], alternative=good, root=root)
    if not found:
        raise NoCheckpoint(f"no complete checkpoint in {root}: save one with `%distrain ckpt save`")
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


def verify_local(folder: str) -> list[integrity.Problem]:
    """Every problem of ``folder``, checked in this process (all files, checksums memoized)."""
    return integrity.verify_folder(folder)


def newest_good(root: str, *, verify=verify_local, exclude: tuple = ()) -> str | None:
    """Name of the newest checkpoint ``verify(folder)`` finds no problem in (None: there is none)."""
    for folder, _ in reversed(entries(root)):
        if folder not in exclude and not verify(folder):
            return os.path.basename(folder)
    return None


def status(folder: str, *, checksums: bool = True) -> str:
    """``good`` or ``DAMAGED: ...``; with ``checksums=False`` sizes only (``sizes ok``)."""
    if checksums:
        problems = integrity.verify_folder(folder)
    else:
        p = integrity.manifest_problem(folder)
        problems = (
            [p]
            if p
            else integrity.check_files(
                folder,
                {
                    k: [v[0] if isinstance(v, list) else v, None]
                    for k, v in integrity.table(read_manifest(folder)).items()
                },
            )
        )
    if problems:
        return "DAMAGED: " + "; ".join(p.text() for p in problems[:3])
    return "good" if checksums else "sizes ok"


def list_checkpoints(root: str, *, checksums: bool = True):
    """A DataFrame (one row per checkpoint, oldest first); a list of dicts without pandas.

    ``status`` is ``good`` (every file's size and checksum as saved) or ``DAMAGED: ...``
    naming the file and what is wrong; folders without a valid manifest are listed too.
    """
    rows = []
    found = entries(root)
    good_latest = None
    for folder, m in found:
        st = status(folder, checksums=checksums)
        rows.append(
            {
                "name": os.path.basename(folder),
                "step": m.step,
                "time": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.time)),
                "_t": m.time,
                "world_size": m.world_size,
                "strategy": m.strategy,
                "loss": m.loss,
                "size_mb": round(m.bytes / 2**20, 3),
                "tag": m.tag or "",
                "auto": m.auto,
                "status": st,
            }
        )
        if not st.startswith("DAMAGED"):
            good_latest = rows[-1]["name"]
    for folder, t, p in damaged_folders(root):
        rows.append(
            {
                "name": os.path.basename(folder),
                "step": None,
                "time": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)),
                "_t": t,
                "world_size": None,
                "strategy": None,
                "loss": None,
                "size_mb": None,
                "tag": "",
                "auto": False,
                "status": "DAMAGED: " + p.text(),
            }
        )
    rows.sort(key=lambda r: r.pop("_t"))
    for r in rows:
        r["latest"] = r["name"] == good_latest
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover
        return rows
    cols = ["name", "step", "time", "world_size", "strategy", "loss", "size_mb", "tag", "auto", "status", "latest"]
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
        try:
            folder, _ = resolve(root, w)
        except DamagedCheckpoint as exc:  # a damaged one can be deleted by its name
            if os.path.basename(exc.folder) != str(w):
                raise
            folder = exc.folder
        if folder not in folders:
            folders.append(folder)
    for f in folders:
        _remove(f)
    return [os.path.basename(f) for f in folders]


def apply_retention(root: str, keep: int, *, protect: str | None = None, verify=verify_local) -> list[str]:
    """Keep the ``keep`` newest *good* auto-saves (``verify(folder)`` finds no problem; ``protect``,
    just written and checked, counts as good); older auto-saves go. Damaged ones never count,
    so the last good one is never deleted; tagged/manual checkpoints are never removed."""
    if keep is None or keep < 1:
        return []
    autos = [f for f, m in entries(root) if m.auto]
    if protect and protect not in autos:
        autos.append(protect)
    good = []
    for f in reversed(autos):
        if f == protect or not verify(f):
            good.append(f)
            if len(good) == keep:
                break
    if len(good) < keep:
        return []  # fewer good ones than asked to keep: delete nothing
    cutoff = autos.index(good[-1])
    removed = []
    for f in autos[:cutoff]:
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
