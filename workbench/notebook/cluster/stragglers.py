"""When one rank's cell fails while others still run: free the others, say what happened.

The usual case is a rank that raised before a collective its peers are already
waiting in. With gloo a waiting rank cannot be interrupted (SIGINT is only acted on
once the collective returns, and ``abort()`` does not wake it), but closing the
connections of the ranks that are done makes its collective raise at once. The
process group is then broken on every rank, so a new one is initialised in place:
the ranks keep their variables.
"""

from __future__ import annotations

import dataclasses
import time

from ...engine import rpc
from ...shared.ranges import ranks_phrase
from .diagnosis import collect_stacks, main_frames, where

GRACE_S = 3.0  # how long ranks still running may take to finish after one failed
LEAVE_WAIT_S = 5.0  # how long a peer's collective may take to notice a closed connection


@dataclasses.dataclass(frozen=True)
class Release:
    """What freeing the ranks still running did."""

    waiting: list[int]  # ranks still running when the grace ran out
    stacks: dict[int, str]  # where each of them was (faulthandler), before the interrupt
    left_group: bool  # the process group had to be closed to free them
    rejoined: bool  # and a new one was initialised on every rank
    stuck: list[int]  # ranks that could not be freed
    note: str = ""  # why re-initialising failed, where it did


def notice(failed: list[int], running: list[int], grace: float) -> str:
    """The line shown as soon as a rank fails while others still run."""
    them = "it" if len(running) == 1 else "them"
    then = (
        f"interrupting {them} now (--fail-fast)"
        if grace <= 0
        else f"interrupting {them} in {grace:g} s unless done (--grace S to wait longer, --fail-fast for at once)"
    )
    return (
        f"{ranks_phrase(failed)} failed; {ranks_phrase(running)} still running — likely waiting in a collective; {then}"
    )


def release(rankset, call) -> Release:
    """Interrupt the ranks of ``call`` still running; close the process group if that is not enough."""
    waiting = call.pending()
    stacks = collect_stacks(rankset, waiting)
    rankset.interrupt(waiting)
    call.ar.wait(1.0)
    left: set[int] = set()
    while call.pending():
        # ranks that are not running this cell close their connections; a peer waiting
        # on one of them then fails, and closes its own in the next round
        busy = set(call.pending())
        idle = [r for r in range(rankset.world_size) if r not in busy and r not in left]
        if not idle:
            break
        try:
            rankset.apply(rpc.handle, rpc.LeaveGroup(), ranks=idle, timeout=10)
        except Exception:
            break
        left.update(idle)
        deadline = time.monotonic() + LEAVE_WAIT_S
        while call.pending() and set(call.pending()) == busy and time.monotonic() < deadline:
            call.ar.wait(0.05)
    stuck = call.pending()
    rejoined, note = False, ""
    if left and not stuck:
        try:
            (port,) = rankset.apply(rpc.handle, rpc.FreePort(), ranks=[0], timeout=30)
            rankset.apply(rpc.handle, rpc.RejoinGroup(master_port=port), timeout=max(30.0, 10.0 * rankset.world_size))
            rejoined = True
        except Exception as exc:  # the ranks stay as they are; the message says what to do
            note = f"re-initialising it failed ({type(exc).__name__}: {exc})"
    return Release(waiting=waiting, stacks=stacks, left_group=bool(left), rejoined=rejoined, stuck=stuck, note=note)


def failure_message(first: list[int], failures: dict, rel: Release, grace: float) -> str:
    """The cell's error: the rank that failed first, then what was done to the others."""
    lines = []
    for rank in first:
        ename, evalue, _ = failures[rank]
        lines.append(f"rank {rank} failed first: {ename}: {evalue} (traceback above)")
    wait = "at once (--fail-fast)" if grace <= 0 else f"after {grace:g} s"
    were = "was" if len(rel.waiting) == 1 else "were"
    lines.append(f"{ranks_phrase(rel.waiting)} {were} still running and interrupted {wait}; where each was:")
    for rank, stack in rel.stacks.items():
        lines.append(f"  [rank {rank}] {where(stack)}")
    for rank, stack in rel.stacks.items():
        frames = main_frames(stack)
        if len(frames) > 1:
            lines.append(f"[rank {rank}] stack, innermost first:")
            lines.extend(f"[rank {rank}]   {f}" for f in frames)
    if rel.stuck:
        lines.append(
            f"{ranks_phrase(rel.stuck)} could not be freed: closing the group on the other ranks did not "
            "end the collective it waits in, and a rank interrupted inside a gloo collective cannot "
            "continue it, so `%distrain restart` is needed to use the ranks again"
        )
    elif rel.rejoined:
        lines.append(
            "the process group was re-initialised: a rank interrupted inside a gloo collective "
            "cannot continue it, so the old group was closed on every rank. The ranks kept their "
            "variables; anything built on the old group (DDP/FSDP wrappers, new_group subgroups) "
            "must be built again, or `%distrain restart` for a clean start"
        )
    elif rel.left_group:
        lines.append(
            "the process group is broken (a rank interrupted inside a collective cannot continue "
            f"it) and {rel.note or 're-initialising it failed'}: `%distrain restart` is needed"
        )
    else:
        lines.append("they were not inside a collective: the process group is usable as it is")
    return "\n".join(lines)
