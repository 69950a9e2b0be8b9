"""Rank side of the check that a folder is shared by every host of the rank set.

A checkpoint written by ranks on several hosts is only whole if each rank writes where
rank 0 (which writes the manifest) can read. The notebook asks rank 0 to leave a token,
every rank to find it and leave its own, and rank 0 to find theirs
(``workbench.notebook.cluster.shared_dir``). Plain files: nothing here imports torch.
"""

from __future__ import annotations

import os
import socket


def _path(folder: str, token: str, rank: int | str) -> str:
    return os.path.join(folder, f".workbench-shared-{token}-{rank}")


def leave_token(folder: str, token: str) -> str:
    """Rank 0: make the folder and write the token file."""
    os.makedirs(folder, exist_ok=True)
    with open(_path(folder, token, 0), "w") as f:
        f.write(token)
    return socket.gethostname()


def see_and_answer(folder: str, token: str, rank: int) -> dict:
    """Every rank: does rank 0's token show here, and can this rank write beside it?"""
    out = {"rank": rank, "host": socket.gethostname(), "sees": False, "error": ""}
    try:
        with open(_path(folder, token, 0)) as f:
            out["sees"] = f.read() == token
    except FileNotFoundError:
        out["error"] = "does not see rank 0's file there"
    except OSError as exc:
        out["error"] = f"cannot read there: {exc.strerror or exc}"
    if rank != 0:
        try:
            os.makedirs(folder, exist_ok=True)
            with open(_path(folder, token, rank), "w") as f:
                f.write(token)
        except OSError as exc:
            out["error"] = out["error"] or f"cannot write there: {exc.strerror or exc}"
    return out


def collect(folder: str, token: str, world_size: int) -> list[int]:
    """Rank 0: the ranks whose files it can read; every token file is removed."""
    seen = [r for r in range(world_size) if os.path.exists(_path(folder, token, r))]
    for r in range(world_size):
        try:
            os.remove(_path(folder, token, r))
        except OSError:
            pass
    return seen
