"""``%distrain logs``: the ranks' log files, where every line they printed is, cells cut or not.

A rank's log is read from the rank set's folder while the rank runs, even mid-flood (the file
lags what the rank printed by at most a second); a rank on another host whose file is not
here reads its own once it is idle (``rpc.ReadLog``). What it shows is bounded as a cell's
output is (``shared.output_cut``), and identical lines of several ranks are shown once.
"""

from __future__ import annotations

import os

from ...shared import output_cut, rank_logs
from ...shared.argtypes import positive_int, regex
from . import flags
from .registry import command

DEFAULT_TAIL = 50
REMOTE_WAIT_S = 5.0


def _build(p) -> None:
    flags.RANKS.add(p, help="the ranks whose logs to show: 0,2-3 or all (default all)")
    p.add_argument(
        "--tail", type=positive_int, default=None, help=f"the last N lines (default {DEFAULT_TAIL}; with --grep: all)"
    )
    p.add_argument("--grep", type=regex, default=None, help="only the lines matching this regular expression")
    g = p.add_mutually_exclusive_group()
    flags.GROUPED.add(g, help="ranks whose lines are the same shown once (default past 8 ranks)")
    flags.PER_RANK.add(g, help="every rank's lines on their own")
    flags.SESSION.add(p)


def read_logs(
    ranks=None, *, tail: int | None = None, grep: str | None = None, limit: int = output_cut.DEFAULT_LIMIT, rankset=None
) -> dict[int, rank_logs.Excerpt]:
    """rank -> what its log gave: the last ``tail`` lines (default 50), or the lines matching
    ``grep`` (the last ``tail`` of them where given); ``limit`` characters in all."""
    from ...engine import rpc
    from .. import api

    rs = rankset or api.current()
    sel = rs.select(ranks)
    if tail is None and grep is None:
        tail = DEFAULT_TAIL
    share = max(output_cut.FLOOR, limit // max(1, len(sel)))
    out: dict[int, rank_logs.Excerpt] = {}
    remote = []
    for rank in sel:
        file = rank_logs.path(rs.state_dir(), rank)
        if os.path.exists(file) or rs.procs[rank].local:
            out[rank] = rank_logs.read(file, tail=tail, grep=grep, limit=share)
        else:
            remote.append(rank)
    if remote:
        call = rs.submit(rpc.handle, rpc.ReadLog(tail=tail, grep=grep, limit=share), ranks=remote)
        try:
            out.update(zip(remote, call.result(timeout=REMOTE_WAIT_S)))
        except TimeoutError:
            for rank in remote:
                host = rs.procs[rank].host
                out[rank] = rank_logs.Excerpt(
                    rank_logs.path(rs.state_dir(), rank),
                    0,
                    (),
                    note=f"on host {host}, busy: its log is read once its cell ends "
                    f"(or there: {rank_logs.path(rs.state_dir(), rank)})",
                )
    return dict(sorted(out.items()))


def format_logs(excerpts: dict[int, rank_logs.Excerpt], *, grep: str | None = None, group: bool | None = None) -> str:
    """Each rank's lines under ``[rank N]`` (identical ones once, by default past 8 ranks), after
    a line saying where the files are."""
    from ...shared.ranges import format_ranks
    from ..cluster import grouping

    def body(e: rank_logs.Excerpt) -> str:
        if e.note:
            return e.note
        if grep is not None:
            head = f"{e.matched:,} line(s) match {grep!r}" + (
                f"; the last {len(e.lines):,} of them:" if len(e.lines) < e.matched else ":"
            )
            return "\n".join([head, *(f"{n}: {text}" for n, text in e.lines)])
        if not e.lines:
            return "(the log is empty)"
        return "\n".join(text for _, text in e.lines)

    folders = sorted({os.path.dirname(e.path) for e in excerpts.values() if e.path})
    sizes = sum(e.size for e in excerpts.values())
    lines = [f"logs of ranks {format_ranks(list(excerpts))} ({output_cut.size_text(sizes)}) in {', '.join(folders)}"]
    items = [(rank, body(e)) for rank, e in excerpts.items()]
    if grouping.resolve(group, len(items)):
        batches = grouping.group_identical(items)
    else:
        batches = [([rank], text) for rank, text in items]
    for ranks, text in batches:
        lines.append(grouping.tag_ranks(ranks, text).rstrip("\n"))
    return "\n".join(lines)


def logs(ranks=None, *, tail: int | None = None, grep: str | None = None, group: bool | None = None) -> str:
    """What ``%distrain logs`` prints, as text."""
    return format_logs(read_logs(ranks, tail=tail, grep=grep), grep=grep, group=group)


@command("logs", "every line the ranks printed: the last lines of their log files, or those matching --grep", _build)
def _logs(args, shell):
    print(logs(args.ranks, tail=args.tail, grep=args.grep, group=args.group))
    return None
