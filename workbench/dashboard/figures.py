"""The dashboard's plots: which series each panel shows, and how a panel is redrawn.

Each panel is a plotly ``FigureWidget`` whose traces are found by name: those known in
advance (per rank, the mean, the step phases) exist from the start; the others (collective
kinds) are created the first time their series appears.
A redraw reads the store's thinned copies (at most ~2x1000 points per line), so its cost
does not grow with the length of the run.

Why the widgets are built the way they are (plotly 7's ``FigureWidget`` is an anywidget):

* A view draws first from the model's full state ``_widget_data`` / ``_widget_layout``
  and afterwards only applies the ``_py2js_*`` edit messages (addTraces, restyle,
  relayout) it receives. plotly assigns that full state inside the constructor after
  ipywidgets has already opened the comm, and re-assigns it only in
  ``_repr_mimebundle_``, which never runs for a figure inside a ``VBox``. In JupyterLab
  a dashboard shown while the kernel is busy had views sitting at exactly the comm_open
  state (no title, no template, no traces) that never caught up, while the status line
  beside them updated. So: the comm opens only once layout *and* every trace known in
  advance (empty, one per rank...) are set (:class:`LiveFigureWidget`, :func:`make_figures`);
  a redraw restyles those traces, each message carrying every changed line whole, so
  a message a view missed is made good by the next; :func:`sync` re-assigns the full
  state so views made later (a re-display, Lab drawing the plot when it scrolls into
  view) start from the current data.
* An edit message is a trait set to the message and at once back to ``None``. When a
  kernel thread handles a message from the browser for the same figure (plotly answers
  every edit with one; ipykernel 7 may handle comm messages off the main thread),
  traitlets holds that figure's notifications and collapses a pair set meanwhile from
  the redraw thread into a single ``None``: the edit is lost. :class:`LiveFigureWidget`
  takes a per-figure lock around incoming messages and :func:`draw` holds it around its edits.
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
    Panel("memory", "memory per rank", "MiB (max active on a device, else RSS)"),
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
                self._edit_lock = threading.RLock()
                self._defer_open = True
                try:
                    super().__init__(*args, **kwargs)
                finally:
                    self._defer_open = False
                self.open()  # now: the comm_open carries the full layout and data

            def open(self):
                # ipywidgets opens the comm inside the constructor, before plotly assigns
                # _widget_layout/_widget_data: a snapshot of the state taken then (the
                # comm_open itself) would be an empty figure
                if not getattr(self, "_defer_open", False):
                    super().open()

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


def expected_traces(ranks) -> dict[str, list[tuple]]:
    """panel -> [(trace name, style)] known before the first step: per rank, the mean, the phases.

    (Collective kinds are not known in advance: those traces are added when they appear.)
    """
    per_rank = [(f"rank {r}", {"width": 1}) for r in ranks]
    return {"loss": [*per_rank, ("mean", {"width": 3, "color": "black"})],
            "throughput": [(f"rank {r}", {}) for r in ranks],
            "memory": [(f"rank {r}", {}) for r in ranks],
            "step_time": [(phase, {"bar": True}) for phase in (*STEP_TIME_PHASES, "control")]}


def _trace(name, xs, ys, style):
    import plotly.graph_objects as go

    if style.get("bar"):
        return go.Bar(name=name, x=xs, y=ys)
    line = {k: v for k, v in style.items() if k in ("width", "color")}
    return go.Scatter(name=name, x=xs, y=ys, mode="lines", line=line)


def make_figures(widget: bool = True, ranks=None) -> dict:
    """One figure per panel (FigureWidget for live use, Figure for export).

    Layout and, given ``ranks``, every trace known in advance (empty) go into the
    constructor, so they are part of the state the widget opens with. A redraw then only
    restyles traces (each message carries every changed line whole, so one that never
    reached a view is made good by the next) instead of adding them: an ``addTraces``
    that a view misses leaves it without the trace for good (see the module doc).
    """
    import plotly.graph_objects as go

    cls = widget_class() if widget else go.Figure
    known = expected_traces(ranks) if ranks is not None else {}
    return {p.key: cls(data=[_trace(name, [], [], style) for name, style in known.get(p.key, [])],
                       layout=panel_layout(p)) for p in PANELS}


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
        for r in ranks:  # max active (device) or RSS (CPU): the y-axis title says which
            xs, ys = store.line(run, mem_metric, r)
            if xs:
                out["memory"].append((f"rank {r}", xs, [y / MB for y in ys], {}))
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
                fig.add_trace(_trace(name, xs, ys, style))
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
