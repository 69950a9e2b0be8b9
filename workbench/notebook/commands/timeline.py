"""``%distrain timeline``: when each rank computed and waited inside the last steps."""

from __future__ import annotations

from . import flags
from .registry import UsageError, command


def _timeline_args(p) -> None:
    flags.STEPS.add(p, default=5, help="how many of the latest steps (default 5, at most 200)")
    flags.RANKS.add(
        p,
        help="the ranks to show: 0,2-3 or all (default all; past 16 ranks the slowest, the fastest and the straggler)",
    )
    flags.RUN.add(p)
    p.add_argument("--table", action="store_true", help="a table per rank and step instead of the chart")
    flags.SESSION.add(p)


@command(
    "timeline",
    "when each rank computed and waited inside the last steps: phases, collectives, the straggler",
    _timeline_args,
)
def _timeline(args, shell):
    from .. import api
    from ..dashboard import timelines
    from ..dashboard.timeline_figure import timeline_figure, timeline_table

    if not 1 <= args.steps <= 200:
        raise UsageError(f"--steps must be between 1 and 200 (the ranks keep the last 200), got {args.steps}")
    api.current().select(args.ranks)  # a bad selection is refused before anything runs
    recs = timelines.records(args.steps, ranks=args.ranks, run=args.run)
    if not recs:
        raise UsageError(
            "no steps recorded on the ranks yet: train a few steps first (`%distrain train start --steps 5`)"
        )
    # ranks chosen by --ranks are all drawn; by default, past 16 ranks, the extremes and the straggler
    return timeline_table(recs) if args.table else timeline_figure(recs, every_rank=args.ranks is not None)
