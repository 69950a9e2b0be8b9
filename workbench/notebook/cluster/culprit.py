"""The conclusion of a hang report: which ranks wait in which collective, and who keeps them waiting.

From each rank's collective flight record (``shared.flight``) and its stack (``diagnosis``): the
ranks inside collective #S of a group wait for the group's ranks that never entered #S, named
with where they are in the user's code (the cell's own line for code of a cell); ranks that
disagree on the op or the size at one sequence number are a mismatch. One or two lines at any
rank count; where no record shows a collective in flight, the stacks say who is in one.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field

from ...shared import flight
from .diagnosis import _PLUMBING, thread_blocks
from .grouping import label

_FRAME = re.compile(r'^"(?P<file>.*)", line (?P<line>\d+) in (?P<func>.*)$')
_CELL_FILE = re.compile(r"/ipykernel_\d+/(\d+)\.py$")
_LIBRARY = ("/site-packages/", "/dist-packages/", "<frozen ", "/lib/python3")
_WORKBENCH = re.compile(r"/workbench/(engine|strategies|models|shared|notebook|planner|labs)/")
_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the workbench package
MAX_PLACES = 3  # places named in one line; the rest are counted


@dataclass(frozen=True)
class Place:
    """Where one rank is: a process state, or its frames (innermost first) with the user's."""

    state: str = ""  # "" when frames were read; else why not (stopped, dead, no answer)
    user: str = ""  # "in load_next_batch (cell line 5)"
    collective: str = ""  # the torch.distributed function its stack is in, if any

    def text(self) -> str:
        return self.state or self.user or "somewhere without a frame of its own code"


@dataclass(frozen=True)
class Verdict:
    """The conclusion: ``text`` (one or two lines; "" when the records and stacks show none)."""

    text: str
    culprits: list[int] = field(default_factory=list)  # ranks the others wait for
    waiting: list[int] = field(default_factory=list)  # ranks inside a collective, waiting
    mismatch: bool = False


def cell_file_name(code: str | None) -> str | None:
    """The file name ipykernel gives ``code`` on the ranks (``<hash>.py``), to tell this cell
    from an earlier one in a stack."""
    if not code:
        return None
    try:
        from ipykernel.compiler import get_tmp_hash_seed, murmur2_x86
    except ImportError:  # pragma: no cover
        return None
    return f"{murmur2_x86(code, get_tmp_hash_seed())}.py"


def _user_frame(file: str) -> bool:
    if _CELL_FILE.search(file) or file.startswith("<ipython-input-"):
        return True
    if file == "<string>" or any(p in file for p in _LIBRARY) or _WORKBENCH.search(file):
        return False  # "<string>": the rank process's own entry (preload's exec)
    return not file.startswith(_HERE + os.sep)


def describe_frame(frame: str, cell: str | None = None) -> str:
    """``in f (cell line 5)``, ``at cell line 5``, ``in f (data.py line 12)`` for one frame;
    ``cell``: the running cell's file name (``cell_file_name``), to tell it from an earlier one."""
    m = _FRAME.match(frame.strip())
    if not m:
        return f"in {frame.strip()}"
    file, line, func = m["file"], m["line"], m["func"]
    if _CELL_FILE.search(file) or file.startswith("<ipython-input-"):
        if cell is None:
            where = f"line {line} of a cell"
        else:
            where = f"cell line {line}" if file.endswith("/" + cell) else f"line {line} of an earlier cell"
        return f"at {where}" if func == "<module>" else f"in {func} ({where})"
    return f"in {func} ({os.path.basename(file)} line {line})"


def cell_thread(stack: str) -> list[str]:
    """The frames of the thread running a cell (the deepest; innermost first) without the
    kernel's own; [] when it runs none (the rank is idle)."""
    blocks = [b for b in thread_blocks(stack) if b]
    if not blocks:
        return []
    return [f for f in max(blocks, key=len) if not any(p in f for p in _PLUMBING)]


def trainer_thread(stack: str) -> list[str]:
    """The training thread's frames (the one running the trainer's loop), for the step watchdog."""
    for block in thread_blocks(stack):
        if any("in _loop" in f and "trainer.py" in f for f in block):
            return block
    return []


_NO_THREAD = {cell_thread: "idle (no cell running)", trainer_thread: "no training thread"}


def place_of(stack: str, *, cell: str | None = None, frames_of=cell_thread) -> Place:
    """Where a rank is, from its faulthandler dump (or the line saying why there is none).
    ``frames_of``: picks the thread (the cell's by default; the trainer's for the step watchdog)."""
    if "(most recent call first)" not in stack:
        return Place(state=(stack.strip().splitlines() or ["no stack"])[0])
    frames = frames_of(stack) or []
    if not frames:
        return Place(state=_NO_THREAD.get(frames_of, "no thread of its own code"))
    collective = ""
    for f in frames:
        m = _FRAME.match(f.strip())
        if not m or m["file"].endswith("comm_timing.py"):
            continue
        if "/torch/autograd/" in m["file"]:
            collective = "backward (DDP's gradient all-reduce)"
        elif m["file"].endswith("agreement.py"):
            collective = "the trainer's step agreement"
        elif "/torch/distributed/" in m["file"]:
            collective = m["func"]
        if collective:
            break
    user = ""
    for f in frames:
        m = _FRAME.match(f.strip())
        if not m or not _user_frame(m["file"]):
            continue
        if m["func"].startswith("<") and m["func"] != "<module>":
            continue  # a comprehension: the function that runs it says more
        user = describe_frame(f, cell)
        break
    if not user and frames:
        user = describe_frame(frames[0], cell)
    return Place(user=user, collective=collective)


def conclude(
    records: dict[int, list[flight.Record] | None],
    places: dict[int, Place],
    world_size: int,
    *,
    now: float | None = None,
) -> Verdict:
    """The conclusion from every rank's record and place (ranks missing from ``places`` are
    not asked about)."""
    now = time.time() if now is None else now
    asked = sorted(places)
    last: dict[str, dict[int, flight.Record]] = {}  # group -> rank -> its latest numbered call
    inside: dict[int, flight.Record] = {}  # rank -> the call it is inside now
    for rank in asked:
        for rec in records.get(rank) or []:
            if not rec.p2p:
                last.setdefault(rec.group, {})[rank] = rec
        open_calls = [r for r in records.get(rank) or [] if r.inside]
        if open_calls:
            inside[rank] = open_calls[-1]
    lines: list[str] = []
    culprits: set[int] = set()
    waiting: set[int] = set()
    mismatch = False
    for group, by_rank in sorted(last.items(), key=lambda kv: kv[0] != "world"):
        members = range(world_size) if group == "world" else (flight.members(group) or sorted(by_rank))
        members = [r for r in members if r in places]
        top = max(rec.seq for rec in by_rank.values())
        at_top = {r: rec for r, rec in by_rank.items() if rec.seq == top and r in members}
        behind = [r for r in members if r not in at_top]
        stuck_in = [r for r, rec in at_top.items() if rec.inside or rec.launched_only]
        if not stuck_in:
            continue
        variants = _variants(at_top)
        if len(variants) > 1:
            mismatch = True
            waiting.update(at_top)
            parts = [f"{label(rs)} {'calls' if len(rs) == 1 else 'call'} {what}" for what, rs in variants]
            lines.append(f"mismatched collective #{top} (group {group}): " + "; ".join(parts))
            continue
        first = min(rec.entered for rec in at_top.values())
        waits = any(rec.inside for rec in at_top.values())
        verb = ("waits in" if len(at_top) == 1 else "wait in") if waits else "launched"
        head = f"{label(sorted(at_top))} {verb} {_op(at_top)} #{top} (group {group})"
        head += f" for {now - first:.1f} s" if waits else ""
        if not behind:
            if all(rec.inside for rec in at_top.values()) and now - first >= 1.0:
                waiting.update(at_top)
                lines.append(
                    f"{head}: every rank of the group entered it and none has left (the transport, "
                    "or a peer outside the set)"
                )
            continue
        waiting.update(at_top)
        culprits.update(behind)
        never = f"{label(behind)} never entered it"
        lines.append(f"{head}; {never}: {_places(behind, places, inside, group, top)}")
    if not lines:
        return _from_stacks(places)
    if len(lines) > 2:
        lines = [*lines[:2], f"(and {len(lines) - 2} more group(s): `%distrain where`)"]
    return Verdict("\n".join(lines), sorted(culprits), sorted(waiting), mismatch)


def _op(at_top: dict[int, flight.Record]) -> str:
    ops = sorted({rec.op for rec in at_top.values()})
    return "/".join(ops)


def _variants(at_top: dict[int, flight.Record]) -> list[tuple[str, list[int]]]:
    """The distinct (op, payload) the ranks called at one sequence number, largest group first."""
    groups: dict[str, list[int]] = {}
    for rank, rec in sorted(at_top.items()):
        sized = rec.kind in flight.SIZED
        what = rec.kind + (f" {rec.dtype}[{rec.numel} elements]" if sized and rec.dtype else "")
        groups.setdefault(what, []).append(rank)
    if len(groups) > 1:  # name them by the functions called, with their shapes
        named: dict[str, list[int]] = {}
        for rank, rec in sorted(at_top.items()):
            named.setdefault(f"{rec.op} {rec.payload()}", []).append(rank)
        if len(named) >= len(groups):
            groups = named
    return sorted(((w, rs) for w, rs in groups.items()), key=lambda g: (-len(g[1]), g[1][0]))


def _places(behind: list[int], places: dict[int, Place], inside: dict[int, flight.Record], group: str, top: int) -> str:
    """Where the ranks that never entered #top are, ranks at one place grouped."""
    texts: dict[str, list[int]] = {}
    for rank in behind:
        rec = inside.get(rank)
        if places[rank].state:
            text = places[rank].state
        elif rec is not None and not rec.p2p and rec.group == group and rec.seq < top:
            text = f"still in {rec.op} #{rec.seq}, {top - rec.seq} behind, {places[rank].user}"
        elif rec is not None:
            what = f"{rec.op} with rank {rec.peer}" if rec.p2p else f"{rec.op} #{rec.seq} (group {rec.group})"
            text = f"in {what}, {places[rank].user}"
        else:
            text = places[rank].text()
        texts.setdefault(text, []).append(rank)
    items = sorted(texts.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))

    def said(text: str, ranks: list[int], who: str) -> str:
        if places[ranks[0]].state:
            return f"{label(ranks)}: {text}"
        return f"{who} {'is' if len(ranks) == 1 else 'are'} {text}"

    if len(items) == 1:
        text, ranks = items[0]
        return said(text, ranks, "it" if len(ranks) == 1 else "they")
    parts = [said(t, rs, label(rs)) for t, rs in items[:MAX_PLACES]]
    if len(items) > MAX_PLACES:
        rest = [r for _, rs in items[MAX_PLACES:] for r in rs]
        parts.append(f"{label(rest)} elsewhere (`%distrain where`)")
    return "; ".join(parts)


def _from_stacks(places: dict[int, Place]) -> Verdict:
    """No record shows a collective in flight: the stacks say who waits in one."""
    in_coll = sorted(r for r, p in places.items() if p.collective and not p.state)
    if not in_coll:
        return Verdict("")
    others = sorted(r for r in places if r not in in_coll)
    ops = sorted({places[r].collective for r in in_coll})
    head = f"{label(in_coll)} {'waits' if len(in_coll) == 1 else 'wait'} in {'/'.join(ops)} (by their stacks)"
    if not others:
        return Verdict(head + ": every rank is in a collective (mismatched collectives, or a lost peer)", [], in_coll)
    them = f"{label(others)} {'is' if len(others) == 1 else 'are'} not in one"
    return Verdict(f"{head}; {them}: {_places(others, places, {}, '', 0)}", others, in_coll)


def read_records(folder: str, ranks: list[int]) -> dict[int, list[flight.Record] | None]:
    """Each rank's flight record from the rank set's ``flight`` folder."""
    return {rank: flight.read(folder, rank) for rank in ranks}


def for_rankset(
    rankset, stacks: dict[int, str], *, code: str | None = None, frames_of=cell_thread, others: dict | None = None
) -> Verdict:
    """The conclusion for ``stacks`` (rank -> faulthandler dump) of ``rankset``'s ranks;
    ``others``: rank -> what the ranks not asked are doing (``done with the cell``)."""
    cell = cell_file_name(code)
    places = {rank: place_of(stack, cell=cell, frames_of=frames_of) for rank, stack in stacks.items()}
    places.update({rank: Place(state=text) for rank, text in (others or {}).items() if rank not in places})
    folder = os.path.join(rankset.state_dir(), "flight")
    return conclude(read_records(folder, sorted(places)), places, rankset.world_size)
