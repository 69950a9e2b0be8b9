"""The notebook end of a pdb session on a rank (see ``engine.rank_debug``).

A rank that stops in pdb announces a loopback port and a token in the rank set's
state folder; the cell that is running attaches, shows pdb's output and asks for
each command with ``input()`` (in a notebook: the kernel's input box).
"""

from __future__ import annotations

import os
import socket
import sys
import time

from .ranges import ranks_phrase


def debug_dir(rankset) -> str:
    return os.path.join(rankset.state_dir(), "debug")


def waiting_sessions(rankset) -> list[int]:
    """Ranks stopped in pdb, waiting for the notebook to attach."""
    try:
        names = os.listdir(debug_dir(rankset))
    except FileNotFoundError:
        return []
    return sorted(int(n[4:-8]) for n in names if n.startswith("rank") and n.endswith(".session"))


def attach(rankset, rank: int, others: list[int] = (), timeout: float = 60.0) -> bool:
    """Run rank ``rank``'s pdb session here until it continues or quits; False if none came."""
    path = os.path.join(debug_dir(rankset), f"rank{rank}.session")
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    with open(path) as fh:
        port, token = fh.read().split()
    waiting = f"; {ranks_phrase(list(others))} still running (waiting)" if others else ""
    print(f"[rank {rank}] stopped in pdb{waiting}. Commands go to rank {rank}; `c` continues, `q` quits", flush=True)
    prompt = f"(Pdb rank {rank}) "
    with socket.create_connection(("127.0.0.1", int(port))) as conn:
        conn.sendall(f"{token}\n".encode())
        buffer = ""
        while True:
            data = conn.recv(65536)
            if not data:
                break
            buffer += data.decode("utf-8", "replace")
            if not buffer.endswith(prompt):
                continue
            text = buffer[: -len(prompt)]
            buffer = ""
            if text:
                sys.stdout.write("".join(f"[rank {rank}] {line}\n" for line in text.splitlines()))
                sys.stdout.flush()
            try:
                command = input(prompt)
            except (EOFError, KeyboardInterrupt):
                command = "q"
            conn.sendall(f"{command}\n".encode())
        if buffer:
            sys.stdout.write("".join(f"[rank {rank}] {line}\n" for line in buffer.splitlines()))
    print(f"[rank {rank}] left pdb", flush=True)
    return True
