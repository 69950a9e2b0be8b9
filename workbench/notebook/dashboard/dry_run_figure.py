"""A dry run's memory per position, beside the planner's: stacked bars, GiB.

For each position two bars: the dry run's (parameters, gradients, optimizer state, and
the rest of its peak: what the step itself held at its worst moment) and the planner's
(the same states, activations in flight, the loss's logits, FSDP's buffers under a
pipeline). Notebook side only: plotly, no torch.
"""

from __future__ import annotations

__all__ = ["dry_run_figure"]

GIB = 2**30
PLANNER_PARTS = ("parameters", "gradients", "optimizer", "activations", "logits", "gathered across micro-batches")
COLORS = {
    "parameters": "#4c78a8",
    "gradients": "#f58518",
    "optimizer": "#54a24b",
    "rest of the peak": "#b279a2",
    "activations": "#b279a2",
    "logits": "#e45756",
    "gathered across micro-batches": "#9d755d",
}


def dry_run_figure(report):
    import plotly.graph_objects as go

    from ...planner.side_by_side import position_terms

    positions = report.result.positions
    x_dry = [f"pos {p.position} (stage {p.stage})" for p in positions]
    fig = go.Figure()
    dry_parts = {
        "parameters": [p.param_bytes for p in positions],
        "gradients": [p.grad_bytes for p in positions],
        "optimizer": [p.optim_bytes for p in positions],
    }
    dry_parts["rest of the peak"] = [
        max(0, p.peak_bytes - p.param_bytes - p.grad_bytes - p.optim_bytes) for p in positions
    ]
    for name, values in dry_parts.items():
        fig.add_bar(
            x=[x_dry, ["dry run"] * len(positions)],
            y=[v / GIB for v in values],
            name=f"dry run: {name}",
            marker_color=COLORS[name],
            legendgroup="dry",
        )
    if report.model is not None:
        terms = [position_terms(report.model, report.layout, p.stage) for p in positions]
        for name in PLANNER_PARTS:
            values = [t[name] for t in terms]
            if not any(values):
                continue
            fig.add_bar(
                x=[x_dry, ["planner"] * len(positions)],
                y=[v / GIB for v in values],
                name=f"planner: {name}",
                marker_color=COLORS[name],
                marker_pattern_shape="/",
                legendgroup="planner",
            )
    fig.update_layout(
        barmode="stack",
        yaxis_title="GiB on the position's rank",
        title=f"dry run of {report.result.spec['kind']} on {report.result.world} ranks: memory per position",
        legend={"groupclick": "toggleitem"},
    )
    return fig
