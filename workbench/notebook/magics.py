"""``%distrain`` and ``%%distrain``: parse, then call the Python API (nothing else)."""

from __future__ import annotations

import argparse

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from ..shared import output_cut
from ..shared.argtypes import non_negative_float, output_limit
from . import api
from .auto_cells import AUTO_MAGIC, MARKER
from .cluster.cell import GRACE_S
from .commands import CommandParser, UsageError, dispatch, flags


def cell_parser() -> CommandParser:
    """``%%distrain [FLAGS]``: how the cell below runs on the ranks."""
    p = CommandParser(prog="%%distrain", description="run the cell on the ranks; variables persist per rank")
    flags.RANKS.add(p, help="the ranks to run on: 0,2-3 or all (default all)")
    flags.TIMEOUT.add(
        p, help="seconds to wait before the cell is reported stuck; the ranks go on running it (default: no limit)"
    )
    p.add_argument(
        "--grace",
        type=non_negative_float,
        default=None,
        metavar="S",
        help="when a rank fails while others still run: seconds they get to finish before they are interrupted "
        f"(default {GRACE_S:g})",
    )
    p.add_argument("--fail-fast", action="store_true", help="interrupt the other ranks as soon as one fails")
    p.add_argument(
        "--stream",
        action="store_true",
        default=None,
        help="show output live as it arrives (default: in a kernel from the first line, "
        "regrouped per rank at the end; elsewhere after 3 s)",
    )
    p.add_argument(
        "--no-stream", dest="stream", action="store_false", help="show output only at the end, grouped per rank"
    )
    flags.GROUPED.add(
        p, help="show identical output of several ranks once, under [ranks 0-13,15] (default past 8 ranks)"
    )
    flags.PER_RANK.add(p, help="show every rank's output on its own")
    p.add_argument(
        "--output",
        type=output_limit,
        default=output_cut.DEFAULT_LIMIT,
        help="how much printed output the cell shows: a head and a tail of each rank's, about 1M in all "
        "(default), a size such as 4M, or all; every line is in the ranks' logs (`%%distrain logs`)",
    )
    flags.SESSION.add(p, help="the session to run on (default: the current one), without making it current")
    p.was("--on", "--session", "the one way to name a session")
    return p


CELL = cell_parser()


@magics_class
class DistrainMagics(Magics):
    @line_magic
    def distrain(self, line: str):
        """%distrain COMMAND [ACTION] [FLAGS]: start, stop, train start, ckpt save, ... on the ranks.

        `%distrain help` lists every command; `%distrain COMMAND -h` its flags.
        """
        return dispatch(line, self.shell)

    @cell_magic("distrain")
    def distrain_cell(self, line: str, cell: str):
        """Run the cell on the ranks; variables persist per rank between cells (`%%distrain -h`: its flags)."""
        import shlex

        try:
            words = shlex.split(line)
        except ValueError as exc:
            raise UsageError(f"could not parse {line!r}: {exc}") from None
        if words in (["-h"], ["--help"]):
            print(CELL.format_help())
            return
        CELL.refuse_earlier(words)
        try:
            args, extra = CELL.parse_known_args(words)
        except argparse.ArgumentError as exc:
            raise UsageError(f"{exc}. usage: {CELL.one_line_usage()}") from None
        if extra:
            CELL.error(f"unrecognized arguments: {' '.join(extra)}")
        if {"--grouped", "--per-rank"} <= set(words):
            raise UsageError("--grouped and --per-rank contradict each other: give one of them")
        if args.grace is not None and args.fail_fast:
            raise UsageError("--grace and --fail-fast contradict each other: give one of them")
        if args.session is not None and len(args.session) > 1:
            raise UsageError(f"--session {','.join(args.session)}: a cell runs on one session's ranks")
        grace = 0.0 if args.fail_fast else (GRACE_S if args.grace is None else args.grace)
        # api.run refuses a bad selection before anything runs
        api.run(
            cell,
            ranks=args.ranks,
            timeout=args.timeout,
            stream=args.stream,
            grace=grace,
            session=args.session[0] if args.session else None,
            group=args.group,
            output=args.output,
        )

    @cell_magic(AUTO_MAGIC)
    def distrain_auto(self, line: str, cell: str):
        """A plain cell in auto mode (`%distrain auto on`): run on every rank, marked as such."""
        print(MARKER, flush=True)
        api.run(cell)

    @cell_magic("local")
    def local(self, line: str, cell: str):
        """Run this cell in the notebook (also in auto mode, where plain cells go to the ranks)."""
        if line.strip():
            raise UsageError(f"%%local takes no options, got {line.strip()!r}")
        result = self.shell.run_cell(cell, store_history=False)
        result.raise_error()
