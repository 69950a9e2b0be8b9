"""The dashboard's plots: which series each panel shows, and how a panel is redrawn.

Each panel is a plotly ``FigureWidget`` whose traces are found by name and created the
first time their series appears (ranks and collective kinds are not known in advance).
A redraw reads the store's thinned copies (at most ~2x1000 points per line), so its cost
does not grow with the length of the run.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..events import COLLECTIVES, STEP_TIME_PHASES

MB = 2**20


@dataclass(frozen=True)
class Panel:
    key: str
    title: str
    yaxis: str


PANELS = (
    Panel("loss", "loss per rank (thin) and data-parallel mean (thick)", "loss"),
    Panel("throughput", "throughput per rank", "tokens / s"),
    Panel("memory", "memory per rank", "MiB"),
    Panel("comm", "collective time per step, by op and rank", "seconds"),
    Panel("step_time", "step time breakdown (mean over ranks)", "seconds"),
)


def make_figures(widget: bool = True) -> dict:
    """One empty figure per panel (FigureWidget for live use, Figure for export)."""
    import plotly.graph_objects as go

    cls = go.FigureWidget if widget else go.Figure
    figs = {}
    for p in PANELS:
        fig = cls()
        fig.update_layout(title=dict(text=p.title, font=dict(size=13)), height=300, margin=dict(l=50, r=10, t=40, b=35),
                          xaxis_title="step", yaxis_title=p.yaxis, legend=dict(font=dict(size=9)),
                          template="plotly_white")
        if p.key == "step_time":
            fig.update_layout(barmode="stack")
        figs[p.key] = fig
    return figs


def lines_for(store, run: str) -> dict[str, list[tuple]]:
    """panel -> [(trace name, xs, ys, style)] for ``run`` from the store's thinned series."""
    ranks = store.ranks(run)
    names = set(store.metric_names(run))
    out: dict[str, list[tuple]] = {p.key: [] for p in PANELS}
    loss_metric = "loss_local" if "loss_local" in names else "loss"
    for r in ranks:
        xs, ys = store.line(run, loss_metric, r)
        if xs:
            out["loss"].append((f"rank {r}", xs, ys, {"width": 1}))
    if "loss" in names and ranks:
        xs, ys = store.line(run, "loss", ranks[0])
        out["loss"].append(("mean", xs, ys, {"width": 3, "color": "black"}))
    for r in ranks:
        xs, ys = store.line(run, "tps", r)
        if xs:
            out["throughput"].append((f"rank {r}", xs, ys, {}))
    mem_metric = next((m for m in ("memory_max_active_bytes", "memory_rss_bytes") if m in names), None)
    if mem_metric:
        label = "max active" if mem_metric == "memory_max_active_bytes" else "rss"
        for r in ranks:
            xs, ys = store.line(run, mem_metric, r)
            if xs:
                out["memory"].append((f"rank {r} {label}", xs, [y / MB for y in ys], {}))
    for kind in COLLECTIVES:
        for r in ranks:
            xs, ys = store.line(run, f"comm/{kind}/time_s", r)
            if xs:
                out["comm"].append((f"{kind} r{r}", xs, ys, {}))
    for phase in (*STEP_TIME_PHASES, "control"):
        per_rank = [store.line(run, f"time_{phase}_s", r) for r in ranks]
        per_rank = [p for p in per_rank if p[0]]
        if not per_rank:
            continue
        xs, ys = _mean_by_step(per_rank)
        out["step_time"].append((phase, xs, ys, {"bar": True}))
    return out


def _mean_by_step(lines: list[tuple[list, list]]) -> tuple[list, list]:
    """Mean over ranks at the steps every rank has (thinned lines share their steps)."""
    common = set(lines[0][0])
    for xs, _ in lines[1:]:
        common &= set(xs)
    sums: dict = {}
    for xs, ys in lines:
        for x, y in zip(xs, ys):
            if x in common:
                sums[x] = sums.get(x, 0.0) + y
    steps = sorted(sums)
    return steps, [sums[s] / len(lines) for s in steps]


def draw(figs: dict, lines: dict[str, list[tuple]]) -> None:
    """Put ``lines`` into ``figs``: update traces in place, add the new ones."""
    import plotly.graph_objects as go

    for key, traces in lines.items():
        fig = figs[key]
        by_name = {t.name: t for t in fig.data}
        with _batch(fig):
            for name, xs, ys, style in traces:
                trace = by_name.get(name)
                if trace is None:
                    if style.get("bar"):
                        fig.add_trace(go.Bar(name=name, x=xs, y=ys))
                    else:
                        line = {k: v for k, v in style.items() if k in ("width", "color")}
                        fig.add_trace(go.Scatter(name=name, x=xs, y=ys, mode="lines", line=line))
                else:
                    trace.x, trace.y = xs, ys


class _batch:
    def __init__(self, fig):
        self.cm = fig.batch_update() if hasattr(fig, "batch_update") else None

    def __enter__(self):
        if self.cm is not None:
            self.cm.__enter__()

    def __exit__(self, *exc):
        if self.cm is not None:
            return self.cm.__exit__(*exc)
        return False
