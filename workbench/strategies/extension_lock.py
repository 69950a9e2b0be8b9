"""A C++ op build the workbench waits on, named: its lock, what holds it, how to clear a stale one.

torch builds an op (DeepSpeed's async I/O, ...) once per folder under ``<build folder>/lock``, a
file the building process creates and keeps open until it is done; every other process waits
while the file exists (``torch.utils.file_baton``), without a word, and for ever where the
builder was ended part-way. Within :func:`named_waits` that wait says at once what it waits for
(the lock, its age, the process holding it), and a lock that no live process on this host holds
is stale: it is refused with its age and the command that removes it.
"""

from __future__ import annotations

import os
import shlex
import time
from contextlib import contextmanager

SCAN_EVERY_S = 1.0  # how often the processes are looked through for the lock's holder
RELEASE_S = 0.5  # a builder closes the lock before removing it: a holder-less lock is looked at again after this


class StaleLock(RuntimeError):
    """A build lock no live process holds: it waits for nothing."""


def holders(lock: str) -> list[int]:
    """The pids of this host's processes holding ``lock`` open (torch's builder keeps it open)."""
    try:
        target = os.stat(lock)
    except OSError:
        return []
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                st = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                found.append(int(pid))
                break
    return found


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read().split(b"\0")
    except OSError:
        return "?"
    text = " ".join(w.decode("utf-8", "replace") for w in words if w)
    return text if len(text) <= 80 else text[:77] + "..."


def age_text(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _age(lock: str) -> float:
    try:
        return time.time() - os.stat(lock).st_mtime
    except OSError:
        return 0.0


def stale_message(lock: str, what: str) -> str:
    return (
        f"{what} cannot be built: torch's build lock {lock} is stale ({age_text(_age(lock))} old, and no "
        "process on this host holds it: a build was ended part-way). Remove it, then run this again: "
        f"`rm {shlex.quote(lock)}`"
    )


def wait_for(lock: str, what: str, say, *, poll: float = 0.1) -> None:
    """Wait while ``lock`` exists, saying at once who holds it (``say(text)``); raise
    :class:`StaleLock` when no process holds it."""
    said = None
    next_scan = 0.0
    while os.path.exists(lock):
        now = time.monotonic()
        if now >= next_scan:
            next_scan = now + SCAN_EVERY_S
            pids = holders(lock)
            if not pids:
                time.sleep(RELEASE_S)
                if os.path.exists(lock) and not holders(lock):
                    raise StaleLock(stale_message(lock, what))
                continue
            if pids != said:
                said = pids
                who = ", ".join(f"pid {p} ({_command(p)})" for p in pids)
                say(
                    f"waiting for {what}: another process is building it (torch's build lock {lock}, "
                    f"{age_text(_age(lock))} old, held by {who}); this goes on once it is built"
                )
        time.sleep(poll)


@contextmanager
def named_waits(what: str, say):
    """Within: torch's wait on a build lock says what it waits for, and a stale lock raises."""
    from torch.utils import file_baton

    original = file_baton.FileBaton.wait

    def wait(self):
        wait_for(self.lock_file_path, what, say, poll=self.wait_seconds)

    file_baton.FileBaton.wait = wait
    try:
        yield
    finally:
        file_baton.FileBaton.wait = original
