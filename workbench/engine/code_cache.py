"""This host's copy of the notebook's folders: a per-user cache, content-addressed.

``blobs/ab/<sha256>`` holds each content once, so a host that has a file is not sent it
again; ``trees/<key>/`` is one folder's copy, the ranks' import path and working folder, with
``<key>.json`` listing what the notebook put there (files the ranks wrote are never deleted).
Writes go to ``tmp/`` and are renamed into place (a writer that died leaves one, swept at the
next sync); ``<key>.lock`` lets the first rank of a host write while the others wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import uuid

from ..shared import replies
from ..shared.code_tree import FileEntry, FolderEdit, tree_digest

STATE_VERSION = 1


def root() -> str:
    """The per-user cache on this host: ``$WORKBENCH_SYNC_CACHE``, else ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    own = os.environ.get("WORKBENCH_SYNC_CACHE")
    if own:
        return os.path.abspath(own)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "workbench", "sync")


def tree_path(key: str) -> str:
    return os.path.join(root(), "trees", key)


def blob_path(sha: str) -> str:
    return os.path.join(root(), "blobs", sha[:2], sha)


def _tmp(tag: str = "") -> str:
    folder = os.path.join(root(), "tmp")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, f"{os.getpid()}.{tag or uuid.uuid4().hex}")


def sweep() -> int:
    """Remove temporary files whose writer (the pid leading the name) is gone; how many."""
    folder = os.path.join(root(), "tmp")
    removed = 0
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return 0
    for name in names:
        pid = name.split(".", 1)[0]
        if pid.isdigit() and (int(pid) == os.getpid() or _alive(int(pid))):
            continue
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(folder, name))
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def locked(key: str):
    """The copy of ``key`` to this process alone (the other ranks of the host wait)."""
    os.makedirs(os.path.join(root(), "trees"), exist_ok=True)
    with open(os.path.join(root(), "trees", key + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def missing(shas) -> list[str]:
    """The contents of ``shas`` this host's cache lacks."""
    return [s for s in dict.fromkeys(shas) if not os.path.exists(blob_path(s))]


def _store(sha: str, data: bytes) -> None:
    """Keep ``data`` as blob ``sha`` (checked), written aside and renamed into place."""
    if os.path.exists(blob_path(sha)):
        return
    if hashlib.sha256(data).hexdigest() != sha:
        raise ValueError(f"content for {sha[:12]} does not match its hash: the file changed while it was sent")
    tmp = _tmp()
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.makedirs(os.path.dirname(blob_path(sha)), exist_ok=True)
        os.replace(tmp, blob_path(sha))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def put(parts) -> int:
    """Contents for the cache as ``(sha, offset, total, data)`` parts, in order per file; a file is
    kept once its last part is in and its hash checks. Bytes written."""
    written = 0
    for sha, offset, total, data in parts:
        if offset == 0 and len(data) == total:
            _store(sha, data)
        else:
            tmp = _tmp(sha + ".part")
            with open(tmp, "r+b" if offset else "wb") as f:
                f.seek(offset)
                f.write(data)
            if offset + len(data) >= total:
                try:
                    if _file_sha(tmp) != sha:
                        raise ValueError(
                            f"content for {sha[:12]} does not match its hash: the file changed while it was sent"
                        )
                    os.makedirs(os.path.dirname(blob_path(sha)), exist_ok=True)
                    os.replace(tmp, blob_path(sha))
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(tmp)
        written += len(data)
    return written


def _file_sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------ a folder's copy
def _state_file(key: str) -> str:
    return os.path.join(root(), "trees", key + ".json")


def read_state(key: str) -> dict:
    """``{"digest": ..., "files": {path: [sha, size, executable]}}`` of the copy (empty if none)."""
    try:
        with open(_state_file(key)) as f:
            state = json.load(f)
        if state.get("version") == STATE_VERSION:
            return state
    except (OSError, ValueError):
        pass
    return {"version": STATE_VERSION, "digest": tree_digest(()), "files": {}}


def _write_state(key: str, files: dict) -> str:
    entries = [FileEntry(p, sha, size, bool(x)) for p, (sha, size, x) in files.items()]
    digest = tree_digest(entries)
    tmp = _tmp()
    with open(tmp, "w") as f:
        json.dump({"version": STATE_VERSION, "digest": digest, "files": files}, f)
    os.replace(tmp, _state_file(key))
    tmp = _tmp()
    with open(tmp, "w") as f:
        f.write(digest)
    os.replace(tmp, _state_file(key)[: -len(".json")] + ".digest")  # read alone by the ranks that find it done
    return digest


def _digest(key: str) -> str | None:
    try:
        with open(_state_file(key)[: -len(".json")] + ".digest") as f:
            return f.read().strip()
    except OSError:
        return None


def _safe(tree: str, path: str) -> str:
    full = os.path.normpath(os.path.join(tree, path))
    if not full.startswith(tree + os.sep):
        raise ValueError(f"{path!r} is not a path below the synced folder")
    return full


def _place(tree: str, entry: FileEntry) -> None:
    """Copy blob ``entry.sha`` to ``entry.path`` in the copy (aside, then renamed: a rank reading
    it sees the old file or the new one, never half)."""
    dest = _safe(tree, entry.path)
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = _tmp()
    try:
        shutil.copyfile(blob_path(entry.sha), tmp)
        os.chmod(tmp, entry.mode)
        os.replace(tmp, dest)
        _drop_bytecode(dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


def _drop_bytecode(source: str) -> None:
    """Bytecode cached for a replaced ``.py``: it is checked by whole seconds and size, so an edit
    of the same size within the second of the last one would load what was there before."""
    if not source.endswith(".py"):
        return
    folder = os.path.join(os.path.dirname(source), "__pycache__")
    stem = os.path.basename(source)[:-3] + "."
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(stem) and name.endswith(".pyc"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, name))


def _remove(tree: str, path: str) -> None:
    full = _safe(tree, path)
    with contextlib.suppress(FileNotFoundError):
        os.remove(full)
    _drop_bytecode(full)
    folder = os.path.dirname(full)
    while folder != tree:  # the folders it leaves empty go too
        try:
            os.rmdir(folder)
        except OSError:
            break
        folder = os.path.dirname(folder)


def checkout(key: str, entries) -> tuple[str, list[str], list[str], int]:
    """Make the copy of ``key`` hold ``entries`` (their contents in the cache): (its digest, the
    paths written, the paths deleted, its size in bytes). Unchanged files are not touched."""
    tree = tree_path(key)
    with locked(key):
        os.makedirs(tree, exist_ok=True)
        state = read_state(key)
        have = state["files"]
        want = {e.path: e for e in entries}
        lacking = missing(e.sha for e in want.values())
        if lacking:
            raise FileNotFoundError(f"{len(lacking)} file(s) of {key} are not in this host's cache yet")
        written = []
        for path, e in want.items():
            old = have.get(path)
            full = _safe(tree, path)
            if old and old[0] == e.sha and bool(old[2]) == e.executable and _size(full) == e.size:
                continue
            _place(tree, e)
            written.append(path)
        deleted = [p for p in have if p not in want]
        for path in deleted:
            _remove(tree, path)
        digest = _write_state(key, {p: [e.sha, e.size, int(e.executable)] for p, e in want.items()})
    return digest, written, deleted, sum(e.size for e in want.values())


def _size(path: str) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def apply_edit(edit: FolderEdit) -> str:
    """Apply ``edit`` to this host's copy: "applied" (this rank wrote it), "found" (another rank
    of the host had) or "out of step" (the copy is at neither digest: a full sync is needed)."""
    tree = tree_path(edit.key)
    if _digest(edit.key) == edit.target:  # another rank of this host wrote it: no lock needed
        return "found"
    with locked(edit.key):
        state = read_state(edit.key)
        if state["digest"] == edit.target:
            return "found"
        if state["digest"] != edit.base:
            return "out of step"
        files = dict(state["files"])
        for entry, data in edit.files:
            _store(entry.sha, data)
            _place(tree, entry)
            files[entry.path] = [entry.sha, entry.size, int(entry.executable)]
        for path in edit.deleted:
            _remove(tree, path)
            files.pop(path, None)
        digest = _write_state(edit.key, files)
    if digest != edit.target:
        return "out of step"
    return "applied"


def plan(key: str, shas) -> replies.SyncPlanned:
    """``rpc.SyncPlan``: where folder ``key``'s copy lives here, and which of ``shas`` the cache lacks
    (temporaries of writers that are gone are swept first)."""
    import socket

    sweep()
    return replies.SyncPlanned(host=socket.gethostname(), tree=tree_path(key), missing=tuple(missing(shas)))


def checkout_reply(key: str, entries) -> replies.SyncCheckedOut:
    """``rpc.SyncCheckout``: make folder ``key``'s copy hold ``entries`` (from the cache)."""
    import socket

    digest, written, deleted, size = checkout(key, entries)
    return replies.SyncCheckedOut(
        host=socket.gethostname(),
        tree=tree_path(key),
        digest=digest,
        written=tuple(written),
        deleted=tuple(deleted),
        size=size,
    )
