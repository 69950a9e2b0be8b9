"""The dashboard's plots: which series each panel shows, and how a panel is redrawn.

Each panel is a plotly ``FigureWidget`` whose traces are found by name and created the
first time their series appears (ranks and collective kinds are not known in advance).
A redraw reads the store's thinned copies (at most ~2x1000 points per line), so its cost
does not grow with the length of the run.

How a plotly 7 ``FigureWidget`` (an anywidget) reaches the browser, and why this module
does what it does:

* A view draws, once, from the model's full state ``_widget_data`` / ``_widget_layout``
  as it was last *assigned* from Python (at construction, and in ``_repr_mimebundle_``,
  which runs only when the figure itself is displayed, never when it sits inside a
  ``VBox``). After that a view only applies the ``_py2js_*`` edit messages it receives
  while it exists; the browser-side model does not keep them. So a panel made empty and
  then given its title and traces by edits is drawn by any later view (a re-display,
  Lab rendering it when it scrolls into view) as plain axes with no title, which then
  ignores every restyle of traces it never got. Hence: the layout is passed to the
  constructor, and :func:`sync` re-assigns the full state after redraws.
* An edit message is a trait set to the message and at once back to ``None``. When the
  kernel's main thread handles a message from the browser for the same figure (plotly
  answers every edit with one), traitlets holds that figure's notifications and
  collapses a pair set meanwhile from the redraw thread into a single ``None``: the
  edit is lost (e.g. an ``addTraces``, after which every restyle names traces the view
  lacks). :class:`LiveFigureWidget` takes a per-figure lock around incoming messages and
  :func:`draw` holds it around its edits.
"""
from __future__ import annotations

import contextlib
import threading
from copy import deepcopy
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


_WIDGET_CLASS: list = [None]


def widget_class():
    """``go.FigureWidget`` whose incoming browser messages wait for a redraw in progress."""
    if _WIDGET_CLASS[0] is None:
        import plotly.graph_objects as go

        class LiveFigureWidget(go.FigureWidget):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self._edit_lock = threading.RLock()

            def set_state(self, sync_data):
                with self._edit_lock:  # never while draw() is sending edits (see the module doc)
                    return super().set_state(sync_data)

        _WIDGET_CLASS[0] = LiveFigureWidget
    return _WIDGET_CLASS[0]


def panel_layout(p: Panel) -> dict:
    layout = dict(title=dict(text=p.title, font=dict(size=13)), height=300, margin=dict(l=50, r=10, t=40, b=35),
                  xaxis=dict(title=dict(text="step")), yaxis=dict(title=dict(text=p.yaxis)),
                  legend=dict(font=dict(size=9)), template="plotly_white")
    if p.key == "step_time":
        layout["barmode"] = "stack"
    return layout


def make_figures(widget: bool = True) -> dict:
    """One empty figure per panel (FigureWidget for live use, Figure for export).

    The layout goes into the constructor, so it is part of the widget's initial state
    that every view draws from (an edit made before a view exists never reaches it).
    """
    import plotly.graph_objects as go

    cls = widget_class() if widget else go.Figure
    return {p.key: cls(layout=panel_layout(p)) for p in PANELS}


def is_widget(fig) -> bool:
    return hasattr(fig, "_widget_data")


def sync(figs: dict) -> None:
    """Assign each widget's full state (what a view created from now on draws first).

    traitlets sends a trait only when its value changed, so an unchanged panel costs nothing.
    """
    for fig in figs.values():
        if not is_widget(fig):
            continue
        with _lock(fig):
            fig._widget_layout = deepcopy(fig._layout_obj._props)
            fig._widget_data = deepcopy(fig._data)


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


def draw(figs: dict, lines: dict[str, list[tuple]]) -> bool:
    """Put ``lines`` into ``figs``: update traces in place, add the new ones; True if any was added.

    Existing traces get their x/y replaced in one batched update per panel (one message);
    new ones are added after it, each with its data. A trace the run has no line for (a
    series of an earlier run) is emptied rather than left showing stale points.
    """
    import plotly.graph_objects as go

    added = False
    for key, traces in lines.items():
        fig = figs[key]
        with _lock(fig):
            by_name = {t.name: t for t in fig.data}
            new = []
            with _batch(fig):
                for name, xs, ys, style in traces:
                    trace = by_name.pop(name, None)
                    if trace is None:
                        new.append((name, xs, ys, style))
                    elif list(trace.x or ()) != xs or list(trace.y or ()) != ys:
                        trace.x, trace.y = xs, ys
                for trace in by_name.values():  # not in this run
                    if trace.x:
                        trace.x, trace.y = [], []
            for name, xs, ys, style in new:
                if style.get("bar"):
                    fig.add_trace(go.Bar(name=name, x=xs, y=ys))
                else:
                    line = {k: v for k, v in style.items() if k in ("width", "color")}
                    fig.add_trace(go.Scatter(name=name, x=xs, y=ys, mode="lines", line=line))
                added = True
    return added


def _lock(fig):
    lock = getattr(fig, "_edit_lock", None)
    return lock if lock is not None else contextlib.nullcontext()


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
