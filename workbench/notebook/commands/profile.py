"""``%distrain profile``: ``torch.profiler`` on the ranks: traces, summary, merged timeline."""

from __future__ import annotations

from . import flags
from .registry import UsageError, command


def _profile_args(p) -> None:
    flags.STEPS.add(p, default=3, help="how many training steps to profile (default 3)")
    flags.RANKS.add(p, help="the ranks to profile: 0,2-3 or all (default all)")
    flags.DIR.add(p, help="the folder for the traces (default profiles/profile-<time>)")
    flags.TIMEOUT.add(p, default=300.0, help="seconds to wait for the traces (default 300)")
    p.add_argument(
        "--code",
        default=None,
        help="profile this code on the ranks instead of trainer steps (run in their namespaces, as %%%%distrain would)",
    )
    flags.SESSION.add(p)
    p.was("--out", "--dir", "--dir names every folder a command writes")


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
            return profiles.profile_cell(args.code, ranks=args.ranks, out=args.dir)
        return profiles.profile(args.steps, ranks=args.ranks, out=args.dir, timeout=args.timeout)
    except WorkbenchError as exc:  # raised on a rank (no trainer, too few steps left): nothing armed there
        raise UsageError(str(exc)) from None
