"""Where stuck ranks are: each rank's Python stacks, read without stopping it.

Every rank registers ``faulthandler`` on SIGUSR1 at bootstrap (see
``workbench.engine.runtime``); faulthandler writes from C, so a rank blocked inside a
collective still answers. A rank stopped with SIGSTOP cannot answer; it is reported
by its process state instead.
"""

from __future__ import annotations

import os
import signal
import time

from .grouping import label


def collect_stacks(rankset, ranks: list[int], wait: float = 1.0) -> dict[int, str]:
    """rank -> the rank's Python stacks (or why none could be read)."""
    stack_dir = os.path.join(rankset.state_dir(), "stacks")
    sizes: dict[int, int] = {}
    out: dict[int, str] = {}
    for rank in ranks:
        proc = rankset.procs[rank]
        state = proc.state()
        if state == "stopped":
            out[rank] = f"process {proc.pid} is stopped (SIGSTOP): it cannot run; `kill -CONT {proc.pid}` resumes it"
            continue
        if not proc.alive():
            out[rank] = f"process {proc.pid} is dead"
            continue
        path = os.path.join(stack_dir, f"rank{rank}.stack")
        sizes[rank] = os.path.getsize(path) if os.path.exists(path) else 0
        try:
            rankset.signal_rank(rank, signal.SIGUSR1)
        except OSError as exc:
            out[rank] = f"could not signal pid {proc.pid}: {exc}"
            sizes.pop(rank)
    deadline = time.monotonic() + wait
    while sizes and time.monotonic() < deadline:
        time.sleep(0.05)
        grown = [r for r in sizes if _grew(os.path.join(stack_dir, f"rank{r}.stack"), sizes[r])]
        if not grown:
            continue
        time.sleep(0.05)  # let faulthandler finish writing: one pause for every rank that answered
        for rank in grown:
            with open(os.path.join(stack_dir, f"rank{rank}.stack")) as fh:
                fh.seek(sizes.pop(rank))
                out[rank] = fh.read().strip()
    for rank in sizes:
        out[rank] = "no stack arrived (the rank did not answer SIGUSR1 within the wait)"
    return dict(sorted(out.items()))


def _grew(path: str, size: int) -> bool:
    return os.path.exists(path) and os.path.getsize(path) > size


_PLUMBING = (
    "/ipykernel/",
    "/tornado/",
    "/asyncio/",
    "<frozen runpy>",
    "/ipyparallel/",
    "/IPython/core/",
    "/traitlets/",
    "/threading.py",
    "/workbench/engine/rpc.py",  # a cell runs inside rpc.RunCell -> cell_runner
    "/workbench/engine/cell_runner.py",
)


def thread_blocks(stack: str) -> list[list[str]]:
    """A faulthandler dump split per thread: each thread's frames, innermost first."""
    blocks: list[list[str]] = []
    for line in stack.splitlines():
        line = line.strip()
        if line.endswith("(most recent call first):"):
            blocks.append([])
        elif line.startswith("File ") and blocks:
            blocks[-1].append(line[5:])
    return blocks


def main_frames(stack: str) -> list[str]:
    """Frames of the thread running the cell, innermost first, without kernel plumbing.

    faulthandler prints one block per thread, innermost frame first; the thread
    running user code has by far the deepest stack.
    """
    blocks = [b for b in thread_blocks(stack) if b]
    if not blocks:
        return []
    deepest = max(blocks, key=len)
    return [f for f in deepest if not any(p in f for p in _PLUMBING)] or deepest[:1]


def stack_lines(rank: int | list[int], frames: list[str], *, title: bool = True) -> list[str]:
    """One rank's (or identical ranks') frames as the notebook shows them everywhere (cell
    timeout, ``%distrain where``, the step watchdog): ``[rank r]   frame`` lines, under a title."""
    tag = f"rank {rank}" if isinstance(rank, int) else label(rank)
    head = [f"[{tag}] stack, innermost first:"] if title else []
    return head + [f"[{tag}]   {f}" for f in frames]


def where(stack: str) -> str:
    """The innermost frame of the cell's thread: '"file", line N in function'."""
    frames = main_frames(stack)
    if frames:
        return frames[0]
    return stack.splitlines()[0] if stack else "?"
