"""``%distrain timeline``: when each rank computed and waited inside the last steps."""

from __future__ import annotations

from ...shared.argtypes import positive_int, rank_selection, seconds
from . import UsageError, command


def _timeline_args(p) -> None:
    p.add_argument(
        "--steps", type=positive_int, default=5, help="how many of the latest steps (default 5, at most 200)"
    )
    p.add_argument(
        "--ranks",
        type=rank_selection,
        default=None,
        help="ranks to show: 0,2-3 or all (default all; past 16 ranks the slowest, the fastest and the straggler)",
    )
    p.add_argument("--run", default=None, help="this run (default: the latest)")
    p.add_argument("--table", action="store_true", help="a table per rank and step instead of the chart")


@command(
    "timeline", "Gantt chart of the last steps per rank: phases, collectives, waiting, the straggler", _timeline_args
)
def _timeline(args, shell):
    from .. import api, timelines
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


@command("pipeline", "the latest pipeline step as it ran: micro-batch x stage blocks beside the bubble formula")
def _pipeline(args, shell):
    from ...shared.errors import WorkbenchError
    from .. import timelines

    try:
        return timelines.pipeline_schedule()
    except WorkbenchError as exc:  # the rank's ValueError, raised naming the rank
        raise UsageError(str(exc).splitlines()[0]) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _profile_args(p) -> None:
    p.add_argument("--steps", type=positive_int, default=3, help="how many training steps to profile (default 3)")
    p.add_argument("--ranks", type=rank_selection, default=None, help="ranks to profile: 0,2-3 or all (default all)")
    p.add_argument("--out", default=None, help="folder for the traces (default profiles/profile-<time>)")
    p.add_argument("--timeout", type=seconds, default=300.0, help="seconds to wait for the traces (default 300)")
    p.add_argument(
        "--code",
        default=None,
        help="profile this code on the ranks instead of trainer steps (run in their namespaces, as %%%%distrain would)",
    )


@command(
    "profile",
    "torch.profiler on the ranks for N steps of their trainer: traces, summary, merged timeline",
    _profile_args,
)
def _profile(args, shell):
    from ...shared.errors import WorkbenchError
    from .. import api, profiles

    if not 1 <= args.steps <= 100:
        raise UsageError(f"--steps must be between 1 and 100, got {args.steps}")
    api.current().select(args.ranks)  # a bad selection is refused before anything runs
    try:
        if args.code is not None:
            if not args.code.strip():
                raise UsageError("--code is empty: give the code to profile, e.g. --code 'y = model(x)'")
            return profiles.profile_cell(args.code, ranks=args.ranks, out=args.out)
        return profiles.profile(args.steps, ranks=args.ranks, out=args.out, timeout=args.timeout)
    except WorkbenchError as exc:  # raised on a rank (no trainer, too few steps left): nothing armed there
        raise UsageError(str(exc)) from None
