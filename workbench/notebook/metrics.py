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


def metrics(run: str | None = "latest", *, wide: bool = False, store=None):
    """A DataFrame of step, rank, metric, value, time (plus run, source).

    ``run``: ``"latest"`` (default), a run id, or ``None`` for every run kept.
    """
    import pandas as pd

    store = store or stream.last_store()
    if store is None:
        return pd.DataFrame(columns=COLUMNS)
    if run == "latest":
        run = store.latest_run()
    rows = store.snapshot_rows(run)
    if not rows:
        return pd.DataFrame(columns=COLUMNS)
    frame = pd.DataFrame(rows)
    if wide:
        return frame.sort_values(["run", "step", "rank"], kind="stable").reset_index(drop=True)
    ids = ["run", "step", "rank", "time", "source"]
    tidy = frame.melt(id_vars=ids, var_name="metric", value_name="value").dropna(subset=["value"])
    tidy["value"] = tidy["value"].astype(float)
    return tidy.sort_values(["run", "step", "rank", "metric"], kind="stable")[COLUMNS].reset_index(drop=True)


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
