"""``%distrain plan``: memory / communication / cost of a layout, before running it.

With arguments it plans a described run (``--model 70b --gpus 256 --hw h100 --tp 8
--pp 8 ...``, the planner's own options). With none it plans the model that is laid
out on the live ranks and sets the prediction beside what the ranks hold: the ranks run
ONE real training step under a memory census (``workbench.engine.memory_census``), and
the "predicted vs measured" DataFrame is the cell's result
(``workbench.notebook.plan_live.plan_live``; draw it with
``workbench.notebook.dashboard.plan_figure.predicted_vs_measured_figure``). With
``--dry-run`` it lays the layout out on this CPU at full scale
(:func:`workbench.notebook.dry_run.dry_run_from_args`).
"""

from __future__ import annotations

from . import UsageError, command


@command(
    "plan",
    "predict memory, communication, step time and cost (no args: the ranks' model, measured over one training step)",
    raw=True,
)
def _plan(argv: list[str], shell):
    if "--dry-run" in argv:
        from ..dry_run import dry_run_from_args

        return dry_run_from_args(argv, shell)
    if not argv:
        from ..plan_live import plan_live

        return plan_live()
    from ...planner import plan_from_args

    try:
        plan = plan_from_args(argv)
    except ValueError as exc:
        raise UsageError(" ".join(str(exc).split())) from None
    print(plan.summary())
    return None
