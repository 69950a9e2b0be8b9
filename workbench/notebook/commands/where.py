"""``%distrain where``: where every rank is right now (Python stacks), without stopping anything.

Uses the faulthandler stacks of :mod:`workbench.notebook.cluster.diagnosis` (SIGUSR1), so it
answers while ranks are busy or blocked in a collective; a SIGSTOPped or dead rank is
reported by its process state.
"""

from __future__ import annotations

from ...shared.argtypes import rank_selection, seconds
from . import command


def _build(p) -> None:
    p.add_argument("--ranks", type=rank_selection, default=None, help="0,2-3 or all (default all)")
    p.add_argument("--full", action="store_true", help="print every thread's stack")
    p.add_argument("--wait", type=seconds, default=2.0, help="seconds to wait for the stacks (default 2)")


def where_ranks(ranks=None, *, wait: float = 2.0, rankset=None) -> dict[int, str]:
    """rank -> stack text (or why there is none), for the selected ranks."""
    from .. import api
    from ..cluster.diagnosis import collect_stacks

    rs = rankset or api.current()
    return collect_stacks(rs, rs.select(ranks), wait=wait)


def format_where(stacks: dict[int, str], *, full: bool = False) -> str:
    from ..cluster.diagnosis import main_frames, stack_lines, where

    lines = []
    for rank, stack in stacks.items():
        frames = main_frames(stack)
        if not frames:  # stopped / dead / no answer: the text says which
            lines.append(f"[rank {rank}] {stack.splitlines()[0] if stack else '?'}")
            continue
        lines.append(f"[rank {rank}] {where(stack)}")
        lines.extend(stack_lines(rank, stack.splitlines() if full else frames[1:8], title=False))
    return "\n".join(lines)


@command("where", "print where every rank is right now (stacks; nothing is stopped)", _build)
def _where(args, shell):
    stacks = where_ranks(args.ranks, wait=args.wait)
    print(format_where(stacks, full=args.full))
    return None
