"""The files of a folder the ranks get, found by one walk: its ``.gitignore`` files followed,
a size limit per file, each file's content hash read again only when its size, time or inode
changed (so the walk before each cell costs a stat per file)."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass

from ...shared.code_tree import FileEntry, tree_digest
from .gitignore import Ignored

# never sent: version control's own folder, bytecode (each Python writes its own), Jupyter's autosaves
LEFT_OUT = frozenset({".git", "__pycache__", ".ipynb_checkpoints"})


@dataclass(frozen=True)
class Listing:
    """One walk's result: the files sent, by path; those past the limit (path, size); the digest."""

    entries: dict
    skipped: tuple[tuple[str, int], ...]
    digest: str

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries.values())


def file_sha(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Folder:
    """A folder of the notebook's host as the ranks get it; :meth:`scan` lists it again."""

    def __init__(self, path: str, limit: int):
        self.path = os.path.abspath(path)
        self.limit = limit
        self._known: dict[str, tuple[tuple[int, int, int], str]] = {}  # path -> ((size, mtime, inode), sha)
        self.listing: Listing | None = None

    def scan(self) -> Listing:
        """Walk the folder; hash only what is new or touched since the last walk."""
        entries: dict[str, FileEntry] = {}
        skipped: list[tuple[str, int]] = []
        known: dict[str, tuple[tuple[int, int, int], str]] = {}
        self._walk(self.path, "", Ignored(), entries, skipped, known)
        self._known = known
        self.listing = Listing(entries, tuple(sorted(skipped)), tree_digest(entries.values()))
        return self.listing

    def _walk(self, full: str, rel: str, ignored: Ignored, entries, skipped, known) -> None:
        try:
            items = list(os.scandir(full))
        except OSError:
            return
        gitignore = next((e for e in items if e.name == ".gitignore" and e.is_file()), None)
        if gitignore is not None:
            try:
                with open(gitignore.path, errors="replace") as f:
                    ignored = ignored.below(rel, f.read())
            except OSError:
                pass
        for item in items:
            if item.name in LEFT_OUT:
                continue
            path = f"{rel}/{item.name}" if rel else item.name
            try:
                if item.is_dir(follow_symlinks=False):
                    if not ignored(path, True):
                        self._walk(item.path, path, ignored, entries, skipped, known)
                    continue
                st = item.stat()  # a link to a file is sent as the file it names
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or ignored(path, False):
                continue
            if st.st_size > self.limit:
                skipped.append((path, st.st_size))
                continue
            mark = (st.st_size, st.st_mtime_ns, st.st_ino)
            before = self._known.get(path)
            try:
                sha = before[1] if before is not None and before[0] == mark else file_sha(item.path)
            except OSError:
                continue
            known[path] = (mark, sha)
            entries[path] = FileEntry(path, sha, st.st_size, bool(st.st_mode & 0o111))

    def read(self, path: str) -> bytes:
        with open(os.path.join(self.path, path), "rb") as f:
            return f.read()
