"""``%distrain plan``: memory, communication, time and cost of a layout, before running it.

On paper with the planner's own flags (``--model 70b --gpus 256 --hw h100 --tp 8 --pp 8 ...``,
:mod:`workbench.planner.arguments`), or ``--live``: the model laid out on the ranks, set beside
what one real training step holds there (:func:`workbench.notebook.plan_live.plan_live`), or
``--dry-run``: the layout laid out by the workbench's strategies at full scale on this CPU
(:func:`workbench.notebook.dry_run.dry_run_from_args`).
"""

from __future__ import annotations

from ...planner.arguments import _parser as planner_parser
from .registry import CommandParser, UsageError, command


def _plan_args(p: CommandParser) -> None:
    for action in planner_parser()._actions:  # described here for `-h` and the grammar; parsed by the planner
        p._add_action(action)
    p.add_argument("--live", action="store_true", help="plan the model on the ranks, measured over one training step")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="lay the layout out with the workbench's strategies at full scale on this CPU, beside the planner",
    )
    p.add_argument(
        "--build",
        metavar="VAR",
        help="with --dry-run: the notebook variable holding a function that returns the model (or its config)",
    )


@command(
    "plan",
    "memory, communication, time and cost of a layout: on paper, --live for the ranks' model, or --dry-run at full scale on this CPU",
    _plan_args,
    raw=True,
)
def _plan(argv: list[str], shell):
    from .registry import COMMANDS

    if argv in (["-h"], ["--help"]):
        print(COMMANDS["plan"].parser.format_help())
        return None
    if "--dry-run" in argv:
        if "--live" in argv:
            raise UsageError("--live plans the ranks' model, --dry-run a layout laid out on this CPU: give one of them")
        from ..dry_run import dry_run_from_args

        return dry_run_from_args(argv, shell)
    if "--build" in argv:
        raise UsageError("--build VAR names the model a dry run lays out: give it with --dry-run")
    if not argv:
        raise UsageError(
            "`%distrain plan` plans a layout on paper (`%distrain plan --model 8b --hw h100 --tp 2`) or the ranks' "
            "model: `%distrain plan --live`; nothing was run"
        )
    if "--live" in argv:
        if argv != ["--live"]:
            others = " ".join(w for w in argv if w != "--live")
            raise UsageError(
                f"--live plans the model on the ranks; {others} describe a layout on paper: give one or the other"
            )
        from ..plan_live import plan_live

        return plan_live()
    from ...planner import plan_from_args

    try:
        plan = plan_from_args(argv)
    except ValueError as exc:
        raise UsageError(" ".join(str(exc).split())) from None
    print(plan.summary())
    return None
