"""Predicted vs measured, as grouped bars: the planner's bytes beside what the ranks hold.

Input is the DataFrame of :func:`workbench.notebook.plan_live.plan_live` (or ``compare``):
one row per (rank, part) with ``predicted_bytes``, ``measured_bytes``, ``ratio`` and
``explanation``. Notebook side only: plotly, no torch.
"""

from __future__ import annotations

__all__ = ["predicted_vs_measured_figure"]


def predicted_vs_measured_figure(df, *, rank: int | None = None, log: bool | None = None):
    """Grouped bars per part (x), predicted and measured side by side.

    ``rank=None`` shows every rank (x is "part / rank N"); a rank shows just that one.
    Hover gives the ratio and the explanation. ``log`` (default: when the bars span more
    than 1000x, e.g. a DeepSpeed 2 GB bucket beside kilobytes of parameters) uses a log
    y axis.
    """
    import plotly.graph_objects as go

    if df is None or len(df) == 0:
        raise ValueError("nothing to draw: the comparison table is empty")
    d = df if rank is None else df[df["rank"] == rank]
    if len(d) == 0:
        raise ValueError(f"no rows for rank {rank}; ranks: {sorted(set(df['rank']))}")
    many = d["rank"].nunique() > 1
    x = [f"{p} / rank {r}" if many else p for p, r in zip(d["part"], d["rank"])]

    def mb(col):
        return [None if v is None or v != v else v / 2**20 for v in d[col]]

    hover = [
        f"ratio {r:.2f}<br>{e}" if r is not None and r == r else f"ratio -<br>{e}"
        for r, e in zip(d["ratio"], d["explanation"])
    ]
    fig = go.Figure(
        [
            go.Bar(
                name="predicted",
                x=x,
                y=mb("predicted_bytes"),
                marker_color="#4C78A8",
                hovertext=hover,
                hovertemplate="%{x}<br>predicted %{y:.3f} MiB<br>%{hovertext}<extra></extra>",
            ),
            go.Bar(
                name="measured",
                x=x,
                y=mb("measured_bytes"),
                marker_color="#F58518",
                hovertext=hover,
                hovertemplate="%{x}<br>measured %{y:.3f} MiB<br>%{hovertext}<extra></extra>",
            ),
        ]
    )
    values = [v for v in mb("predicted_bytes") + mb("measured_bytes") if v]
    if log is None:
        log = bool(values) and max(values) / max(min(values), 1e-12) > 1000
    fig.update_layout(
        barmode="group",
        title="planner prediction vs what the ranks hold (per rank, per step)",
        yaxis={"title": "MiB", "type": "log" if log else "linear"},
        height=420,
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
        legend={"orientation": "h"},
    )
    return fig
