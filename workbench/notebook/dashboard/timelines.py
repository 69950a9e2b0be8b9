"""Notebook-side: the per-rank timeline of the last steps (``%distrain timeline``).

Pulls the ranks' step records (``workbench.engine.timeline``: spans the trainer already
measures) and draws them (``workbench.notebook.dashboard.timeline_figure``).
"""

from __future__ import annotations

from ...engine import rpc
from .. import api

__all__ = ["records", "timeline", "pipeline_runs", "pipeline_schedule"]


def records(steps: int = 5, *, ranks=None, run: str | None = None, rankset=None) -> list[dict]:
    """The last ``steps`` step records of every selected rank (of ``run``, default the latest)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    rs = rankset if rankset is not None else api.current()
    return [
        rec.to_dict()
        for per_rank in rs.apply(rpc.handle, rpc.RecentSteps(steps=int(steps), run_id=run), ranks=ranks)
        for rec in per_rank.records
    ]


def timeline(steps: int = 5, *, ranks=None, run: str | None = None, rankset=None):
    """A Gantt chart of the last ``steps`` steps on the selected ranks."""
    from .timeline_figure import timeline_figure

    return timeline_figure(records(steps, ranks=ranks, run=run, rankset=rankset))


def pipeline_runs(*, rankset=None) -> list[dict]:
    """Every stage's latest pipeline step as it ran (see ``PipelinePrepared.last_run``)."""
    rs = rankset if rankset is not None else api.current()
    return [run.to_dict() for run in rs.apply(rpc.handle, rpc.PipelineRun())]


def pipeline_schedule(*, rankset=None):
    """The latest pipeline step as it ran: micro-batch x stage blocks, beside the bubble."""
    from .pipeline_figure import schedule_figure

    return schedule_figure(pipeline_runs(rankset=rankset))
