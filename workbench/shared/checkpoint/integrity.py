"""Is a checkpoint whole? Sizes and checksums recorded at save, checked before anything is loaded.

Pure Python (no torch): the ranks check the files they read, each file by one rank
(:func:`reader_rank`) so they check in parallel, and the notebook checks a folder itself for
``ckpt list`` and retention. A damaged checkpoint is refused with :class:`DamagedCheckpoint`,
which names every problem and the newest good checkpoint to load instead."""

from __future__ import annotations

import json
import os
import re
import zlib
from dataclasses import asdict, dataclass

__all__ = [
    "ALGO",
    "DamagedCheckpoint",
    "Problem",
    "checksum",
    "record",
    "reader_rank",
    "check_files",
    "verify_folder",
    "describe_problems",
]

try:
    import xxhash as _xxhash
except ImportError:  # pragma: no cover - xxhash is a dependency; crc32 keeps old installs working
    _xxhash = None

# xxh3_64 is several times faster than crc32 and sha256 on one core (benchmarks/FINDINGS.md)
ALGO = "xxh3_64" if _xxhash is not None else "crc32"
_CHUNK = 8 << 20
# a file's verdict by (path, size, mtime, ctime, expected checksum): a checkpoint is read once
# per process however often it is listed; writing to a file changes its ctime, which no user
# can set back
_MEMO: dict[tuple, bool] = {}
_SHARD = re.compile(r"^__(\d+)_\d+\.distcp$")
_RANK_FILE = re.compile(r"^rank-(\d+)\.json$")


@dataclass(frozen=True)
class Problem:
    """One damaged file: ``what`` is ``missing``, ``truncated``, ``too long``, ``checksum``,
    ``unreadable`` or ``manifest`` (the manifest itself is missing or invalid)."""

    file: str
    rank: int
    what: str
    detail: str = ""

    def text(self) -> str:
        return f"{self.file} (read by rank {self.rank}) is {self._what()}" + (f": {self.detail}" if self.detail else "")

    def _what(self) -> str:
        return {
            "missing": "missing",
            "truncated": "truncated",
            "too long": "longer than saved",
            "checksum": "corrupt (checksum mismatch)",
            "unreadable": "unreadable",
            "manifest": "missing or invalid",
        }.get(self.what, self.what)

    def to_dict(self) -> dict:
        return asdict(self)


class DamagedCheckpoint(RuntimeError):
    """A checkpoint whose files are missing, truncated or corrupt; nothing of it was loaded."""

    def __init__(
        self, folder: str, problems: list[Problem], *, alternative: str | None = None, root: str | None = None
    ):
        self.folder, self.problems, self.alternative = folder, list(problems), alternative
        super().__init__(describe_problems(folder, self.problems, alternative=alternative, root=root))


def describe_problems(
    folder: str, problems: list[Problem], *, alternative: str | None = None, root: str | None = None
) -> str:
    name = os.path.basename(folder.rstrip("/"))
    shown = "; ".join(p.text() for p in problems[:6]) + (f"; (+{len(problems) - 6} more)" if len(problems) > 6 else "")
    text = f"checkpoint {name} is damaged, nothing was loaded: {shown}."
    if alternative:
        text += f" The newest good checkpoint is {alternative}: `%distrain ckpt load {alternative}`."
    elif root is not None:
        text += f" There is no good checkpoint in {root} to load instead."
    return text


def checksum(path: str, algo: str = ALGO) -> str:
    """``ALGO:hex`` of a file's bytes, read in 8 MiB chunks."""
    if algo == "xxh3_64":
        if _xxhash is None:
            raise RuntimeError("this checkpoint was checksummed with xxh3_64: `pip install xxhash` to verify it")
        h = _xxhash.xxh3_64()
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                h.update(chunk)
        return f"{algo}:{h.hexdigest()}"
    if algo == "crc32":
        c = 0
        with open(path, "rb") as fh:
            while chunk := fh.read(_CHUNK):
                c = zlib.crc32(chunk, c)
        return f"{algo}:{c:08x}"
    raise ValueError(f"unknown checksum algorithm {algo!r}: this workbench knows xxh3_64 and crc32")


def record(path: str, algo: str | None = ALGO) -> list:
    """``[size, checksum]`` of a file as the manifest holds it (checksum None with ``algo=None``)."""
    size = os.path.getsize(path)
    return [size, checksum(path, algo) if algo else None]


def reader_rank(name: str, world: int) -> int:
    """The rank that checks file ``name`` (relative path) at world size ``world``."""
    base = os.path.basename(name)
    m = _SHARD.match(base) or _RANK_FILE.match(base)
    return int(m.group(1)) % max(1, world) if m else 0


def _check_one(folder: str, name: str, rec, rank: int) -> Problem | None:
    path = os.path.join(folder, name)
    size, expected = (rec[0], rec[1]) if isinstance(rec, (list, tuple)) else (int(rec), None)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return Problem(name, rank, "missing", f"expected {size:,} bytes")
    except OSError as exc:
        return Problem(name, rank, "unreadable", exc.strerror or str(exc))
    if st.st_size < size:
        return Problem(name, rank, "truncated", f"{st.st_size:,} of {size:,} bytes")
    if st.st_size > size:
        return Problem(name, rank, "too long", f"{st.st_size:,} bytes, {size:,} saved")
    if not expected:
        return None
    key = (os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, expected)
    if key in _MEMO:
        return (
            None
            if _MEMO[key]
            else Problem(name, rank, "checksum", f"{expected.split(':')[0]} differs from the saved one")
        )
    try:
        got = checksum(path, expected.split(":", 1)[0])
    except OSError as exc:
        return Problem(name, rank, "unreadable", exc.strerror or str(exc))
    _MEMO[key] = got == expected
    if got != expected:
        return Problem(name, rank, "checksum", f"{got} read, {expected} saved")
    return None


def check_files(folder: str, integrity: dict, *, rank: int | None = None, world: int = 1) -> list[Problem]:
    """Check the files of ``integrity`` (name -> [size, checksum]) that ``rank`` reads (all: None)."""
    out = []
    for name in sorted(integrity):
        r = reader_rank(name, world)
        if rank is not None and r != rank:
            continue
        p = _check_one(folder, name, integrity[name], r)
        if p is not None:
            out.append(p)
    return out


def manifest_problem(folder: str) -> Problem | None:
    """The manifest itself: missing, not JSON, or without the integrity table."""
    path = os.path.join(folder, "manifest.json")
    try:
        with open(path, encoding="utf-8") as fh:
            d = json.load(fh)
    except FileNotFoundError:
        return Problem("manifest.json", 0, "manifest", "the file is missing (deleted or never written)")
    except (OSError, ValueError) as exc:
        return Problem("manifest.json", 0, "manifest", f"not readable JSON ({exc})")
    if not isinstance(d, dict):
        return Problem("manifest.json", 0, "manifest", "does not hold a JSON object")
    return None


def table(manifest) -> dict:
    """name -> [size, checksum] of a manifest (sizes only for manifests saved without checksums)."""
    return dict(manifest.integrity) if getattr(manifest, "integrity", None) else dict(manifest.files)


def verify_folder(folder: str, *, rank: int | None = None, world: int | None = None) -> list[Problem]:
    """Every problem of ``folder`` that ``rank`` checks (all of them with ``rank=None``); files are
    named with the rank that reads them at world size ``world`` (default: the saved one)."""
    from .manifest import ManifestError, read_manifest

    if rank in (None, 0):
        p = manifest_problem(folder)
        if p is not None:
            return [p]
    try:
        m = read_manifest(folder)
    except ManifestError as exc:
        return [Problem("manifest.json", 0, "manifest", str(exc))]
    return check_files(folder, table(m), rank=rank, world=world or m.world_size)
