"""Which cells run on the ranks, where their code starts, and the ids the ranks' parts get.

JupyterLab names a cell by a path the kernel derives from its text (``dumpCell``); a
``%%distrain`` cell's code starts below the magic's line, so line L of the code the ranks run
is line L + offset of the cell. The ranks appear to the debugger as threads, and their frames
and variables as ids, in ranges the kernel's own debugger (debugpy: small thread ids, frame
and variable ids that are memory addresses, below 2**47) never reaches, and that a browser
still holds exactly (below 2**53).
"""

from __future__ import annotations

from ...shared.debug_wire import CellOrigin

RANK_MAGIC = "%%distrain"
THREAD_BASE = 1 << 48  # the thread of all stopped ranks; rank r is THREAD_BASE + 1 + r
REF_BASE = 1 << 49  # frames and variables of rank r: REF_BASE + (r << 32) + the rank's own number
ALL_FRAME = REF_BASE - 1  # the call stack's entry for every stopped rank at once
_LOCAL = (1 << 32) - 1


def rank_thread(rank: int) -> int:
    return THREAD_BASE + 1 + rank


def thread_rank(thread_id) -> int | str | None:
    """The rank of a rank thread, ``"all"`` for the thread of all stopped ranks, else None."""
    if not isinstance(thread_id, int) or not THREAD_BASE <= thread_id < REF_BASE - 1:
        return None
    return "all" if thread_id == THREAD_BASE else thread_id - THREAD_BASE - 1


def encode(rank: int, local: int) -> int:
    if not 0 <= local <= _LOCAL:
        raise ValueError(f"a rank's id {local} is out of range")
    return REF_BASE + (rank << 32) + local


def decode(ref) -> tuple[int, int] | None:
    """(rank, the rank's own number) of an id made by :func:`encode`; None for any other id."""
    if not isinstance(ref, int) or ref < REF_BASE:
        return None
    return (ref - REF_BASE) >> 32, (ref - REF_BASE) & _LOCAL


def magic_line(code: str) -> int | None:
    """The index of the ``%%distrain`` line a cell starts with (blank lines before it allowed)."""
    for i, line in enumerate(code.splitlines()):
        if not line.strip():
            continue
        head = line.lstrip()
        if head.startswith(RANK_MAGIC) and (len(head) == len(RANK_MAGIC) or head[len(RANK_MAGIC)] in " \t"):
            return i
        return None
    return None


def runs_on_ranks(code: str, auto: bool = False) -> bool:
    """Whether a cell's code runs on the ranks: a ``%%distrain`` cell, or (``%distrain auto on``)
    any cell that does not start with a magic, a shell escape or help."""
    if magic_line(code) is not None:
        return True
    first = next((line.lstrip() for line in code.splitlines() if line.strip()), "")
    return auto and bool(first) and not first.startswith(("%", "!", "?"))


def origin(path: str, code: str) -> CellOrigin:
    """Where a rank cell's code starts in the cell ``code`` named ``path``."""
    line = magic_line(code)
    return CellOrigin(path=path, offset=0 if line is None else line + 1)


def check_lines(code: str, offset: int, lines: list[int]) -> list[tuple[int, str | None]]:
    """Each breakpoint line with why it can never stop the ranks (None: it can)."""
    count = len(code.splitlines())
    out = []
    for line in lines:
        if line <= offset:
            out.append((line, "this line runs in the notebook: a breakpoint on the ranks goes on the cell's code"))
        elif line > count:
            out.append((line, f"the cell has {count} lines"))
        else:
            out.append((line, None))
    return out
