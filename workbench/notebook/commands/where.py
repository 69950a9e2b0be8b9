"""``%distrain where``: where every rank is right now (Python stacks), without stopping anything.

Uses the faulthandler stacks of :mod:`workbench.notebook.cluster.diagnosis` (SIGUSR1), so it
answers while ranks are busy or blocked in a collective; a SIGSTOPped or dead rank is
reported by its process state.
"""

from __future__ import annotations

import re

from . import flags
from .registry import command

# where ipykernel compiles a cell: /tmp/ipykernel_<pid>/<hash of the code>.py
_CELL_FILE = re.compile(r"(/ipykernel_)\d+(/\d+\.py)")


def _build(p) -> None:
    flags.RANKS.add(p, help="the ranks to show: 0,2-3 or all (default all)")
    p.add_argument("--full", action="store_true", help="every thread's whole stack")
    flags.TIMEOUT.add(p, default=2.0, help="seconds to wait for the stacks (default 2)")
    g = p.add_mutually_exclusive_group()
    flags.GROUPED.add(g, help="ranks at the same place shown once (default past 8 ranks)")
    flags.PER_RANK.add(g, help="every rank's stack on its own")
    flags.SESSION.add(p)
    p.was("--wait", "--timeout", "--timeout is how long a command waits")


def where_ranks(ranks=None, *, wait: float = 2.0, rankset=None) -> dict[int, str]:
    """rank -> stack text (or why there is none), for the selected ranks."""
    from .. import api
    from ..cluster.diagnosis import collect_stacks

    rs = rankset or api.current()
    return collect_stacks(rs, rs.select(ranks), wait=wait)


def format_where(stacks: dict[int, str], *, full: bool = False, group: bool | None = None) -> str:
    """Each rank's place and frames; ranks whose stacks are the same are shown once under
    ``[ranks 0-1021]`` (by default past ``GROUP_PAST`` ranks), the largest group first."""
    from ..cluster import grouping
    from ..cluster.diagnosis import main_frames, stack_lines, where

    def shown(stack: str) -> tuple[str, tuple[str, ...]]:
        frames = main_frames(stack)
        if not frames:  # stopped / dead / no answer: the text says which
            return (stack.splitlines()[0] if stack else "?"), ()
        return where(stack), tuple(stack.splitlines() if full else frames[1:8])

    grouped = grouping.resolve(group, len(stacks))
    if grouped:  # the same cell on every rank: its file differs only by each kernel's pid
        stacks = {rank: _CELL_FILE.sub(r"\1<pid>\2", stack) for rank, stack in stacks.items()}
    items = [(rank, shown(stack)) for rank, stack in stacks.items()]
    if grouped:
        groups = sorted(grouping.group_identical(items), key=lambda g: (-len(g[0]), g[0][0]))
        summary = [f"{grouping.label(ranks)}: {head}" for ranks, (head, _) in groups]
        lines = [f"{len(groups)} place(s) for {len(stacks)} ranks:", *(f"  {s}" for s in summary)]
    else:
        groups = [([rank], value) for rank, value in items]
        lines = []
    for ranks, (head, frames) in groups:
        lines.append(f"[{grouping.label(ranks)}] {head}")
        lines.extend(stack_lines(ranks[0] if len(ranks) == 1 else ranks, list(frames), title=False))
    return "\n".join(lines)


def conclusion(stacks: dict[int, str], rankset=None) -> str:
    """Who waits in which collective for whom (``cluster.culprit``), "" when no rank waits."""
    from .. import api
    from ..cluster import culprit

    rs = rankset or api.current()
    return culprit.for_rankset(rs, stacks, code=rs.last_cell).text


@command("where", "where every rank is right now (stacks), led by who waits for whom; nothing stopped", _build)
def _where(args, shell):
    stacks = where_ranks(args.ranks, wait=args.timeout)
    lead = conclusion(stacks)
    print((lead + "\n" if lead else "") + format_where(stacks, full=args.full, group=args.group))
    return None
