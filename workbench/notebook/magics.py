"""``%distrain`` and ``%%distrain``: parse, then call the Python API (nothing else)."""

from __future__ import annotations

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..shared import output_cut
from ..shared.argtypes import non_negative_float, output_limit, rank_selection, seconds
from . import api
from .auto_cells import AUTO_MAGIC, MARKER
from .cluster.cell import GRACE_S
from .commands import UsageError, dispatch


@magics_class
class DistrainMagics(Magics):
    @line_magic
    def distrain(self, line: str):
        """%distrain start -n 4 | status | stop | restart [-n N] | push NAME | pull NAME | ...

        `%distrain help` lists every sub-command.
        """
        return dispatch(line, self.shell)

    @magic_arguments()
    @argument("--on", default=None, help="the named rank set to run on, without making it current")
    @argument("--ranks", type=rank_selection, default=None, help="ranks to run on: 0,2-3 or all (default all)")
    @argument(
        "--timeout", type=seconds, default=None, help="seconds before the cell is reported stuck (default: no timeout)"
    )
    @argument(
        "--grace",
        type=non_negative_float,
        default=None,
        help="when a rank fails while others still run: seconds they get to finish "
        "before they are interrupted (default 3)",
    )
    @argument("--fail-fast", action="store_true", help="interrupt the other ranks as soon as one fails")
    @argument(
        "--stream",
        action="store_true",
        default=None,
        help="show output live as it arrives (default: in a kernel from the first line, "
        "regrouped per rank at the end; elsewhere after 3 s)",
    )
    @argument("--no-stream", dest="stream", action="store_false", help="show output only at the end, grouped per rank")
    @argument(
        "--grouped",
        dest="group",
        action="store_true",
        default=None,
        help="show identical output of several ranks once, under [ranks 0-13,15] (default past 8 ranks)",
    )
    @argument(
        "--per-rank", dest="group", action="store_false", default=None, help="show every rank's output on its own"
    )
    @argument(
        "--output",
        type=output_limit,
        default=output_cut.DEFAULT_LIMIT,
        metavar="SIZE",
        help="how much printed output the cell shows: a head and a tail of each rank's, about 1M in all "
        "(default), a size such as 4M, or all; every line is in the ranks' logs (`%%distrain logs`)",
    )
    @cell_magic("distrain")
    def distrain_cell(self, line: str, cell: str):
        """Run the cell on the ranks; variables persist per rank between cells."""
        try:
            args = parse_argstring(self.distrain_cell, line)
        except Exception as exc:  # UsageError from magic_arguments
            raise UsageError(
                f"{exc}. usage: %%distrain [--ranks 0,2-3|all] [--timeout S] "
                "[--grace S|--fail-fast] [--stream|--no-stream] [--grouped|--per-rank] [--output all|SIZE] [--on NAME]"
            ) from None
        if {"--grouped", "--per-rank"} <= set(line.split()):
            raise UsageError("--grouped and --per-rank contradict each other: give one of them")
        if args.grace is not None and args.fail_fast:
            raise UsageError("--grace and --fail-fast contradict each other: give one of them")
        grace = 0.0 if args.fail_fast else (GRACE_S if args.grace is None else args.grace)
        # api.run refuses a bad selection before anything runs
        api.run(
            cell,
            ranks=args.ranks,
            timeout=args.timeout,
            stream=args.stream,
            grace=grace,
            on=args.on,
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
