"""Reading a rank's log file (``engine.rank_log`` writes it): its last lines, or the lines that match.

Pure, so the notebook reads the files of ranks on its own host and a rank on another host
reads its own (``rpc.ReadLog``) with the same code. Reads from the end in blocks: the last
lines of a large log cost what they hold, not the file's size.
"""

from __future__ import annotations

import os
import re
from collections import deque

from .replies import LogExcerpt as Excerpt

BLOCK = 1 << 16


def folder(state_dir: str) -> str:
    return os.path.join(state_dir, "logs")


def path(state_dir: str, rank: int) -> str:
    return os.path.join(folder(state_dir), f"rank{rank}.log")


def read(file: str, *, tail: int | None = None, grep: str | None = None, limit: int = 1 << 20) -> Excerpt:
    """The last ``tail`` lines of ``file``, or (``grep``) its lines matching the pattern, the last
    ``tail`` of them where given; at most ``limit`` characters of lines in all."""
    try:
        size = os.path.getsize(file)
    except OSError:
        return Excerpt(file, 0, (), note="no log yet: this rank has printed nothing")
    if grep is None:
        return Excerpt(file, size, tuple((0, line) for line in _last_lines(file, size, tail or 0, limit)))
    pattern = re.compile(grep)
    found: deque[tuple[int, str]] = deque()
    chars = matched = 0
    with open(file, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            if pattern.search(line):
                matched += 1
                found.append((number, line.rstrip("\n")))
                chars += len(line)
                while (tail and len(found) > tail) or (chars > limit and len(found) > 1):
                    chars -= len(found.popleft()[1]) + 1
    return Excerpt(file, size, tuple(found), matched)


def _last_lines(file: str, size: int, n: int, limit: int) -> list[str]:
    if n <= 0:
        return []
    with open(file, "rb") as fh:
        data = b""
        pos = size
        while pos > 0 and data.count(b"\n") <= n and len(data) <= limit:
            step = min(BLOCK, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
    lines = data.decode("utf-8", "replace").splitlines()
    if pos > 0:  # the first piece may be the end of a longer line
        lines = lines[1:]
    lines = lines[-n:]
    chars = 0
    for i in range(len(lines) - 1, -1, -1):
        chars += len(lines[i]) + 1
        if chars > limit:
            return lines[i + 1 :]
    return lines
