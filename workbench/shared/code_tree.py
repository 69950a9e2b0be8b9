"""A synced folder as both sides name it: its files by content (``FileEntry``), the tree's
digest, and sizes as people write them (``64M``, ``5G``).

The notebook lists its folder as entries; a host's cache keeps the same entries for the
copy it holds, so one digest comparison tells whether a host is up to date. Pure.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

EMPTY = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class FileEntry:
    """One file of a synced folder: its path below the folder (``/``-separated), content hash
    (sha256, hex), size in bytes and whether it is executable."""

    path: str
    sha: str
    size: int
    executable: bool = False

    @property
    def mode(self) -> int:
        return 0o755 if self.executable else 0o644


def tree_digest(entries) -> str:
    """One hash for a whole folder's entries (order does not matter)."""
    h = hashlib.sha256()
    for e in sorted(entries, key=lambda e: e.path):
        h.update(f"{e.path}\0{e.sha}\0{int(e.executable)}\n".encode())
    return h.hexdigest()


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_size(text) -> int:
    """``64M``, ``5G``, ``1.5GB``, ``200k`` or a number of bytes -> bytes (units of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"a size is 0 or more bytes, got {text}")
        return text
    m = _SIZE.match(str(text))
    if not m or (m.group(3) and not m.group(2) and m.group(3).lower() != "b"):
        raise ValueError(f"a size is a number with an optional unit (e.g. 64M, 5G, 500k), got {text!r}")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_size(n: int) -> str:
    """Bytes as a short human size (``1.2 kB`` style, units of 1024)."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


@dataclass(frozen=True)
class FolderEdit:
    """What changed in one synced folder since the copy at ``base``: the files written (with
    their contents) and the paths deleted; applied, the copy is at ``target``."""

    key: str
    base: str
    target: str
    files: tuple[tuple[FileEntry, bytes], ...] = ()
    deleted: tuple[str, ...] = ()
    folder: str = ""  # the folder on the notebook's host (ranks there reload from it, write nothing)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(e.path for e, _ in self.files)


def source_digest(package_dir: str) -> str:
    """One hash of a package's Python sources (``*.py`` below ``package_dir``, by path and content):
    two installs of the same version built from different sources differ here."""
    import os

    h = hashlib.sha256()
    found = []
    for folder, dirs, files in os.walk(package_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [os.path.join(folder, f) for f in files if f.endswith(".py")]
    for path in sorted(found):
        h.update(os.path.relpath(path, package_dir).replace(os.sep, "/").encode() + b"\0")
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()
