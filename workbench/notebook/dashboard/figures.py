"""The dashboard's plot: which series each panel shows, and how it is redrawn.

The dashboard is **one** plotly ``FigureWidget`` (made fit for live redraws in ``widget``) with
a panel per subplot, not a figure per panel (:func:`make_figure` says why). Traces are found by
``meta`` = ``"<panel>:<name>"`` (names repeat across panels: "rank 0"); those known in advance
exist from the start, the others (collective kinds) are added when their series appears. A
redraw restyles the traces in place from the store's thinned copies (:func:`draw`), so its cost
does not grow with the run; :func:`sync` re-assigns the full state for views made later.
"""

from __future__ import annotations

import contextlib
import time
from copy import deepcopy
from dataclasses import dataclass

from ...shared.events import COLLECTIVES, STEP_TIME_PHASES
from . import bands
from .widget import widget_class

MB = 2**20
COLUMNS = 2
ROW_HEIGHT = 290


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
    Panel("grad_norm", "gradient norm before clipping", "grad_norm"),
)
# past bands.BAND_PAST ranks two panels more: rank x step heatmaps (bounded bins, see bands.heatmap)
HEATMAPS = (
    Panel("loss_map", "loss, rank x step (in each bin of ranks: the one furthest from the median)", "rank"),
    Panel("step_map", "step time (s), rank x step (the slowest stands out)", "rank"),
)
PANEL_KEYS = tuple(p.key for p in PANELS + HEATMAPS)


def _axes(i: int) -> dict:
    """The x/y axis and legend of panel ``i`` (subplots are numbered row by row)."""
    n = "" if i == 0 else str(i + 1)
    return {"xaxis": f"x{n}", "yaxis": f"y{n}", "legend": f"legend{n}"}


def trace_key(panel: str, name: str) -> str:
    return f"{panel}:{name}"


def panel_traces(fig, panel: str) -> list:
    """The traces of one panel, in the order they were added."""
    prefix = trace_key(panel, "")
    return [t for t in fig.data if isinstance(t.meta, str) and t.meta.startswith(prefix)]


def figure_layout(heatmaps: bool = False) -> dict:
    """Subplots (2 columns), one legend inside each panel's top-right corner, stacked bars;
    with ``heatmaps`` a last row of the two rank x step heatmaps."""
    from plotly.subplots import make_subplots

    panels = PANELS + HEATMAPS if heatmaps else PANELS
    rows = -(-len(panels) // COLUMNS)
    grid = make_subplots(
        rows=rows,
        cols=COLUMNS,
        subplot_titles=[p.title for p in panels],
        horizontal_spacing=0.12 if heatmaps else 0.09,  # room for the left heatmap's colour bar
        vertical_spacing=0.11,
    )
    layout = grid.layout.to_plotly_json()
    for ann in layout.get("annotations", []):
        ann["font"] = {"size": 13}
    for i, p in enumerate(panels):
        axes = _axes(i)
        x_name, y_name = "xaxis" + axes["xaxis"][1:], "yaxis" + axes["yaxis"][1:]
        layout[x_name]["title"] = {"text": "step", "standoff": 2}
        layout[y_name]["title"] = {"text": p.yaxis, "font": {"size": 11}}
        x0, x1 = layout[x_name]["domain"]
        y0, y1 = layout[y_name]["domain"]
        layout[axes["legend"]] = {
            "x": x1,
            "y": y1,
            "xanchor": "right",
            "yanchor": "top",
            "bgcolor": "rgba(255,255,255,0.7)",
            "font": {"size": 9},
        }
        if p in HEATMAPS:  # ranks down the side, rank 0 on top
            layout[y_name]["autorange"] = "reversed"
    layout.update(
        height=rows * ROW_HEIGHT + 60,
        margin=dict(l=60, r=20, t=40, b=40),
        template="plotly_white",
        barmode="stack",
        showlegend=True,
    )
    return layout


def expected_traces(ranks) -> dict[str, list[tuple]]:
    """panel -> [(trace name, style)] known before the first step: per rank, the mean, the phases.

    (Collective kinds are not known in advance: those traces are added when they appear.)
    Past ``bands.BAND_PAST`` ranks the per-rank panels have a band and outlier slots instead.
    """
    ranks = list(ranks)
    if bands.banded(len(ranks)):
        per_rank = plain = bands.band_names()
    else:
        per_rank = [(f"rank {r}", {"width": 1}) for r in ranks]
        plain = [(f"rank {r}", {}) for r in ranks]
    return {
        "loss": [*per_rank, ("mean", {"width": 3, "color": "black"})],
        "throughput": plain,
        "memory": plain,
        "step_time": [(phase, {"bar": True}) for phase in (*STEP_TIME_PHASES, "control")],
        "grad_norm": [("grad_norm", {"width": 2})],
        **({"loss_map": [("loss", HEAT)], "step_map": [("step time", HEAT)]} if bands.banded(len(ranks)) else {}),
    }


HEAT = {"heatmap": True}


def _colorbar(panel: str) -> dict:
    """A heatmap's colour bar, beside its own panel (the figure has two)."""
    layout = _heat_layout()
    axes = _axes(PANEL_KEYS.index(panel))
    x1 = layout["xaxis" + axes["xaxis"][1:]]["domain"][1]
    y0, y1 = layout["yaxis" + axes["yaxis"][1:]]["domain"]
    return {"x": x1 + 0.005, "xanchor": "left", "y": (y0 + y1) / 2, "len": y1 - y0, "thickness": 10}


_HEAT_LAYOUT: dict = {}


def _heat_layout() -> dict:
    if not _HEAT_LAYOUT:
        _HEAT_LAYOUT.update(figure_layout(heatmaps=True))
    return _HEAT_LAYOUT


def _trace(panel: str, name, xs, ys, style):
    import plotly.graph_objects as go

    where = {**_axes(PANEL_KEYS.index(panel)), "meta": trace_key(panel, name), "name": style.get("label", name)}
    where.pop("legend")
    if style.get("heatmap"):
        return go.Heatmap(
            x=xs,
            y=ys,
            z=style.get("z", []),
            **where,
            colorscale="Viridis",
            colorbar=_colorbar(panel),
            hovertemplate="the bin of ranks from %{y}<br>the bin of steps from %{x}<br>"
            + name
            + " %{z:.4g}<extra></extra>",
        )
    where["legend"] = _axes(PANEL_KEYS.index(panel))["legend"]
    if style.get("bar"):
        return go.Bar(x=xs, y=ys, **where)
    line = {k: v for k, v in style.items() if k in ("width", "color")}
    fill = {k: v for k, v in style.items() if k in ("fill", "fillcolor")}
    return go.Scatter(x=xs, y=ys, mode="lines", line=line, **fill, **where)


def make_figure(widget: bool = True, ranks=None):
    """The dashboard figure (a FigureWidget for live use, a Figure for export).

    One figure with a panel each (loss, throughput, memory, collective time, step-time
    breakdown, gradient norm), not a figure per panel: plotly 7's ``FigureWidget`` is an
    anywidget, and every anywidget *model* imports its own copy of plotly's JavaScript bundle in
    the browser, from a blob the browser cannot cache. A figure per panel is an import per
    panel, which on a small machine keeps the browser's main thread busy until the plots lag
    far behind the run (while a plain ipywidget beside them updates live). Re-showing the
    dashboard adds views of the same model, which import nothing.

    Layout and, given ``ranks``, every trace known in advance (empty) go into the
    constructor, so they are part of the state the widget opens with. A redraw then only
    restyles traces (each message carries every changed line whole, so one that never
    reached a view is made good by the next) instead of adding them: an ``addTraces``
    that a view misses leaves it without the trace for good.
    """
    import plotly.graph_objects as go

    cls = widget_class() if widget else go.Figure
    known = expected_traces(ranks) if ranks is not None else {}
    data = [_trace(key, name, [], [], style) for key in PANEL_KEYS for name, style in known.get(key, [])]
    return cls(data=data, layout=figure_layout(heatmaps=bool(known.get("loss_map"))))


def is_widget(fig) -> bool:
    return hasattr(fig, "_widget_data")


def sync(fig) -> None:
    """Assign the widget's full state (what a view created from now on draws first).

    traitlets sends a trait only when its value changed, so an unchanged figure costs nothing.
    """
    if not is_widget(fig):
        return
    with _lock(fig):
        fig._widget_layout = deepcopy(fig._layout_obj._props)
        fig._widget_data = deepcopy(fig._data)


def lines_for(store, run: str) -> dict[str, list[tuple]]:
    """panel -> [(trace name, xs, ys, style)] for ``run`` from the store's thinned series.

    xs and ys are float64 numpy arrays (read-only, shared with the store): plotly
    validates a list element by element and sends it as JSON (a cost that grows with the
    run), an array goes as a binary buffer.
    """

    import numpy as np

    def line(metric, r):
        return store.arrays(run, metric, r)

    ranks = store.ranks(run)
    names = set(store.metric_names(run))
    out: dict[str, list[tuple]] = {p.key: [] for p in PANELS}
    banded = bands.banded(len(ranks))

    def per_rank(panel: str, metric: str, style: dict, scale: float = 1.0) -> list:
        lines = [line(metric, r) for r in ranks]
        if banded:  # a band, the median and the outlying ranks (see bands)
            out[panel].extend(bands.band_traces(lines, ranks, scale=scale))
            return lines
        for r, (xs, ys) in zip(ranks, lines):
            if len(xs):
                out[panel].append((f"rank {r}", xs, ys / scale if scale != 1.0 else ys, style))
        return lines

    loss_metric = "loss_local" if "loss_local" in names else "loss"
    loss_lines = per_rank("loss", loss_metric, {"width": 1})
    if banded:  # rank x step heatmaps, binned (at most bands.MAP_ROWS x MAP_COLUMNS cells)
        out["loss_map"], out["step_map"] = [], []
        for panel, metric, name in (("loss_map", loss_metric, "loss"), ("step_map", "time_step_s", "step time")):
            lines = loss_lines if panel == "loss_map" else [line(metric, r) for r in ranks]
            found = bands.heatmap(lines, ranks) if metric in names else None
            if found is not None:
                steps, starts, z, _labels = found
                out[panel].append((name, steps, np.asarray(starts, dtype=float), {**HEAT, "z": z}))
    if "loss" in names and ranks:
        xs, ys = line("loss", ranks[0])
        out["loss"].append(("mean", xs, ys, {"width": 3, "color": "black"}))
    per_rank("throughput", "tps", {})
    mem_metric = next((m for m in ("memory_max_active_bytes", "memory_rss_bytes") if m in names), None)
    if mem_metric:  # max active (device) or RSS (CPU): the y-axis title says which
        per_rank("memory", mem_metric, {}, scale=MB)
    for kind in COLLECTIVES:
        metric = f"comm/{kind}/time_s"
        if metric not in names:
            continue
        lines = [line(metric, r) for r in ranks]
        if banded:  # the median rank and the slowest, per collective kind
            have = [ln for ln in lines if len(ln[0])]
            if have:
                xs, matrix = bands.common_steps(have)
                out["comm"].append((f"{kind} median", xs, np.median(matrix, axis=0), {}))
                out["comm"].append((f"{kind} max", xs, matrix.max(axis=0), {"width": 1}))
            continue
        for r, (xs, ys) in zip(ranks, lines):
            if len(xs):
                out["comm"].append((f"{kind} r{r}", xs, ys, {}))
    for phase in (*STEP_TIME_PHASES, "control"):
        per_rank = [line(f"time_{phase}_s", r) for r in ranks]
        per_rank = [p for p in per_rank if len(p[0])]
        if not per_rank:
            continue
        xs, ys = _mean_by_step(per_rank)
        out["step_time"].append((phase, xs, ys, {"bar": True}))
    if "grad_norm" in names and ranks:  # one global norm: every rank computes the same value
        xs, ys = line("grad_norm", ranks[0])
        out["grad_norm"].append(("grad_norm", xs, ys, {"width": 2}))
    return out


def _mean_by_step(lines: list[tuple]) -> tuple:
    """Mean over ranks at the steps every rank has (thinned lines share their steps)."""
    common, matrix = bands.common_steps(lines)
    return common, matrix.mean(axis=0)


def _same(current, new) -> bool:
    """Whether a trace's data (a tuple, an array or None) already is ``new``."""
    import numpy as np

    new = np.asarray(new)
    if current is None:
        return len(new) == 0
    current = np.asarray(current)
    return current.shape == new.shape and np.array_equal(current, new, equal_nan=current.dtype.kind == "f")


def draw(fig, lines: dict[str, list[tuple]]) -> bool:
    """Put ``lines`` into ``fig``: update traces in place, add the new ones; True if any was added.

    Existing traces get their x/y replaced in one restyle (one message); new ones are added
    after it, each with its data. A trace the run has no line for (a series of an earlier
    run) is emptied rather than left showing stale points.

    The comparison and the restyle work on the figure's raw trace dicts: setting ``trace.x``
    runs plotly's validator on every array (a dataframe-library check per assignment) and
    reading it back builds a property object: most of a redraw's CPU, twice a second while a
    run streams, on cores the ranks train on (benchmarks/FINDINGS.md, what the helpers cost).
    The arrays ``lines_for`` gives are read-only float64 arrays, already what validation
    would produce.
    """
    import numpy as np

    added = False
    with _lock(fig):
        sent = getattr(fig, "_last_trace_edit_id", 0)
        where = {t.get("meta"): i for i, t in enumerate(fig._data)}
        changed: list[int] = []
        xs_new: list = []
        ys_new: list = []
        names_new: list = []  # an outlier slot's label names the rank it shows now
        heat: dict[str, list] = {"i": [], "x": [], "y": [], "z": []}  # heatmaps: restyled apart (z)
        new = []
        for panel, traces in lines.items():
            for name, xs, ys, style in traces:
                i = where.pop(trace_key(panel, name), None)
                label = style.get("label", name)
                if i is None:
                    new.append((panel, name, xs, ys, style))
                elif style.get("heatmap"):
                    old = fig._data[i]
                    if not (
                        _same(old.get("x"), xs)
                        and _same(old.get("y"), ys)
                        and _same(np.ravel(old.get("z") if old.get("z") is not None else ()), np.ravel(style["z"]))
                    ):
                        for key, value in (("i", i), ("x", xs), ("y", ys), ("z", style["z"])):
                            heat[key].append(value)
                elif not (
                    _same(fig._data[i].get("x"), xs)
                    and _same(fig._data[i].get("y"), ys)
                    and fig._data[i].get("name") == label
                ):
                    changed.append(i)
                    xs_new.append(xs)
                    ys_new.append(ys)
                    names_new.append(label)
        for i in where.values():  # not in this run
            if fig._data[i].get("type") == "heatmap":
                if not _same(fig._data[i].get("x"), ()):
                    for key, value in (("i", i), ("x", np.empty(0)), ("y", []), ("z", [])):
                        heat[key].append(value)
                continue
            if not _same(fig._data[i].get("x"), ()):
                changed.append(i)
                xs_new.append(np.empty(0))
                ys_new.append(np.empty(0))
                names_new.append(fig._data[i].get("name"))
        if changed:
            fig.plotly_restyle({"x": xs_new, "y": ys_new, "name": names_new}, trace_indexes=changed)
        if heat["i"]:
            fig.plotly_restyle({"x": heat["x"], "y": heat["y"], "z": heat["z"]}, trace_indexes=heat["i"])
        for panel, name, xs, ys, style in new:
            fig.add_trace(_trace(panel, name, xs, ys, style))
            added = True
        if getattr(fig, "_last_trace_edit_id", 0) != sent:
            fig._sent_at = time.monotonic()
    return added


def _lock(fig):
    lock = getattr(fig, "_edit_lock", None)
    return lock if lock is not None else contextlib.nullcontext()


def recovery_shapes(recoveries: list[dict]) -> list[dict]:
    """A dotted red line across every panel at each recovery's checkpoint step (where the run
    went on from), for ``train start --max-failures`` (``notebook.runs.budget``)."""
    return [
        {
            "type": "line",
            "xref": "x",
            "yref": "paper",
            "x0": r["checkpoint_step"],
            "x1": r["checkpoint_step"],
            "y0": 0,
            "y1": 1,
            "line": {"color": "#c00", "dash": "dot", "width": 1},
            "name": f"recovery {r['n']}",
        }
        for r in recoveries
        if r.get("checkpoint_step") is not None
    ]


def mark_recoveries(fig, recoveries: list[dict]) -> bool:
    """Put the recovery markers on ``fig``; True when they changed."""
    shapes = recovery_shapes(recoveries)
    with _lock(fig):
        if len(fig.layout.shapes or ()) == len(shapes):
            return False
        fig.update_layout(shapes=shapes)
    return True
