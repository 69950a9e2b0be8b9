"""The notebook end of a pdb session on a rank (see ``engine.rank_debug``).

A rank that stops in pdb (``breakpoint()``, or a post-mortem) asks for a session over its
debug link (the rank set's debug hub: signed, and reachable from every host the ranks run
on); the cell that is running attaches, shows pdb's output and asks for each command with
``input()`` (in a notebook: the kernel's input box).
"""

from __future__ import annotations

import queue
import sys
import time

from ...shared.ranges import ranks_phrase
from ..debugger import hub as debug_hub


def waiting_sessions(rankset) -> list[int]:
    """Ranks stopped in pdb, waiting for the notebook to attach."""
    h = debug_hub.existing(rankset)
    return sorted(h.pdb_open) if h is not None else []


def _tagged(rank: int, text: str) -> None:
    if text:
        sys.stdout.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
        sys.stdout.flush()


def attach(rankset, rank: int, others: list[int] = (), timeout: float = 60.0) -> bool:
    """Run rank ``rank``'s pdb session here until it continues or quits; False if none came."""
    h = debug_hub.of(rankset)
    messages = h.pdb_messages(rank)
    deadline = time.monotonic() + timeout
    while rank not in h.pdb_open:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    while True:  # the session's own opening (an earlier session's leftovers are dropped)
        message = messages.get()
        if message.get("kind") == "open":
            break
    waiting = f"; {ranks_phrase(list(others))} still running (waiting)" if others else ""
    print(f"[rank {rank}] stopped in pdb{waiting}. Commands go to rank {rank}; `c` continues, `q` quits", flush=True)
    h.pdb_send(rank, {"op": "attach"})
    while True:
        try:
            message = messages.get(timeout=1.0)
        except queue.Empty:
            if rank not in h.pdb_open and messages.empty():
                break  # the rank's link went away without closing
            continue
        _tagged(rank, message.get("text", ""))
        if message.get("kind") == "close":
            break
        if message.get("kind") != "prompt":
            continue
        try:
            command = input(message.get("prompt", f"(Pdb rank {rank}) "))
        except (EOFError, KeyboardInterrupt):
            command = "q"
        h.pdb_send(rank, {"op": "line", "line": command})
    print(f"[rank {rank}] left pdb", flush=True)
    return True
