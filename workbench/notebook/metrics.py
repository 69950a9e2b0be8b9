"""``workbench.metrics()``: every step of every rank as one tidy table, and its export.

Tidy (one row per step, rank, metric) because that is what pandas, plotly express and
a spreadsheet all group and pivot without reshaping; ``wide=True`` gives one row per
(step, rank) instead. Read from the notebook's event store, never from the ranks, so it
works while training runs and after the ranks stopped.
"""

from __future__ import annotations

import pathlib

from . import stream

COLUMNS = ["run", "step", "rank", "metric", "value", "time", "source"]


def metrics(run: str | None = "latest", *, wide: bool = False, store=None, session=None, **earlier):
    """A DataFrame of step, rank, metric, value, time (plus run, source).

    ``run``: ``"latest"`` (default), a run id, or ``None`` for every run kept.
    ``session``: a session's name, a list of them or ``"all"``: their tables one under the other,
    a ``session`` column first naming each row's session (``run`` is then per session).
    """
    import pandas as pd

    from .keywords import refuse

    refuse("workbench.metrics", earlier, {"sessions": "session"})
    if session is not None:
        from .session import KERNEL

        names = list(KERNEL.by_name) if session == "all" else [session] if isinstance(session, str) else list(session)
        frames = []
        for name in names:
            one = metrics(run, wide=wide, store=stream.last_store(name))
            one.insert(0, "session", name)
            frames.append(one)
        if not frames:
            return pd.DataFrame(columns=["session"] + COLUMNS)
        return pd.concat(frames, ignore_index=True)
    store = store or stream.last_store()
    if store is None:
        return pd.DataFrame(columns=COLUMNS)
    if run == "latest":
        run = store.latest_run()
    rows = store.snapshot_rows(run)
    spilled = store.history.tidy(run) if store.history is not None and store.spilled else None
    if not rows and spilled is None:
        return pd.DataFrame(columns=COLUMNS)
    if wide and spilled is None:
        return pd.DataFrame(rows).sort_values(["run", "step", "rank"], kind="stable").reset_index(drop=True)
    tidy = _tidy(pd.DataFrame(rows)) if rows else pd.DataFrame(columns=COLUMNS)
    if spilled is not None:  # the rows that left the store's window, read back from its Parquet history
        tidy = pd.concat([spilled[COLUMNS], tidy], ignore_index=True) if len(tidy) else spilled[COLUMNS]
    tidy = tidy.sort_values(["run", "step", "rank", "metric"], kind="stable")[COLUMNS].reset_index(drop=True)
    if not wide:
        return tidy
    ids = ["run", "rank", "step", "time", "source"]
    out = tidy.pivot_table(index=ids, columns="metric", values="value", aggfunc="last").reset_index()
    out.columns.name = None
    return out.sort_values(["run", "step", "rank"], kind="stable").reset_index(drop=True)


def _tidy(frame):
    ids = ["run", "step", "rank", "time", "source"]
    tidy = frame.melt(id_vars=ids, var_name="metric", value_name="value").dropna(subset=["value"])
    tidy["value"] = tidy["value"].astype(float)
    return tidy


def export_metrics(path, run: str | None = "latest", *, store=None) -> pathlib.Path:
    """Write :func:`metrics` to ``path``: ``.csv`` or ``.parquet`` (by the file's suffix)."""
    path = pathlib.Path(path)
    frame = metrics(run, store=store)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    elif path.suffix in (".parquet", ".pq"):
        frame.to_parquet(path, index=False)
    else:
        raise ValueError(f"export_metrics writes .csv or .parquet, not {path.suffix!r} ({path})")
    return path


def compare(*names: str, metric: str = "loss", run: str | None = "latest"):
    """One plotly figure of ``metric`` against step, a line per session (its ranks' mean),
    so two layouts trained side by side read as one plot: ``compare("ddp", "fsdp")``.
    Without names: every session of the kernel."""
    import plotly.graph_objects as go

    from .session import KERNEL

    names = names or tuple(KERNEL.by_name)
    for name in names:
        KERNEL.get(name)  # an unknown name: the error lists the sessions there are
    frame = metrics(run, session=list(names))
    known = sorted(set(frame["metric"])) if len(frame) else []
    if len(frame) and metric not in known:
        raise ValueError(f"no metric {metric!r} in these sessions' runs; they have: {', '.join(known)}")
    fig = go.Figure()
    for name in names:
        rows = frame[(frame["session"] == name) & (frame["metric"] == metric)]
        mean = rows.groupby("step")["value"].mean()
        fig.add_trace(go.Scatter(x=mean.index.to_numpy(), y=mean.to_numpy(), mode="lines", name=name))
    fig.update_layout(title=f"{metric} per session", xaxis_title="step", yaxis_title=metric)
    return fig
