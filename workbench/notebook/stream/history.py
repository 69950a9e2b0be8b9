"""The whole step history of a long run, on disk: a Parquet file the event store spills into.

The store keeps a bounded window of step rows in memory (a run of hours would otherwise grow
the notebook without end); a row that falls out of the window is written here, so
``workbench.metrics()`` still gives every step: the file's rows, then the window's. Rows go in
tidy form (:data:`COLUMNS`), one schema whatever metrics a trainer reports. Nothing is written
before the first spill: a run that fits in the window writes nothing.
"""

from __future__ import annotations

import os
import threading

ROLLBACK = "__rollback__"  # metric name of a rollback mark (value: the step it goes back to)
COLUMNS = ("run", "rank", "step", "time", "source", "metric", "value")


class History:
    """Spilled step rows under folder ``path``: one Parquet part per flush of ``flush_every`` rows
    (thread-safe).

    Whole files per flush (``part-00000.parquet``...) rather than one open writer: nothing
    is held open between flushes (no file descriptor for the run's lifetime), and every part
    is readable at once; together they are one Parquet dataset (``pd.read_parquet(path)``).
    """

    def __init__(self, path, *, flush_every: int = 10_000):
        self._where = path  # a folder, or a function naming it at the first spill (`ckpt dir` may change)
        self.path: str | None = path if isinstance(path, str) else None
        self.flush_every = flush_every
        self.written = 0  # tidy rows in the parts
        self.lost = 0  # tidy rows a failed write could not keep (a full disk): counted, never raised
        self.errors: list[str] = []
        self._parts = 0
        self._pending: list[tuple] = []
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        """For a detached set's keeper (``notebook.handoff``): the folder is decided now (the
        rows go on into the same dataset), what is pending travels with it."""
        with self._lock:
            state = dict(self.__dict__)
        state.pop("_lock")
        if not isinstance(state["_where"], str):
            state["_where"] = state["path"] or os.path.abspath(state["_where"]())
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def add_row(self, row: dict) -> None:
        """One wide store row (ids + metrics), as tidy rows."""
        ids = (row["run"], int(row["rank"]), int(row["step"]), float(row["time"]), row["source"])
        items = [(*ids, k, float(v)) for k, v in row.items() if k not in _IDS and v is not None]
        with self._lock:
            self._pending.extend(items)
            if len(self._pending) >= self.flush_every:
                self._flush_or_count()

    def roll_back(self, run: str, rank: int, step: int, when: float) -> None:
        """Rows of ``run``/``rank`` written so far from ``step`` on were replaced (a recovery or a NaN
        rollback further back than the window): written as a ``ROLLBACK`` row, from which readers
        drop that rank's earlier-written rows from that step on."""
        with self._lock:
            self._pending.append((run, int(rank), int(step), float(when), "store", ROLLBACK, float(step)))

    def flush(self) -> None:
        with self._lock:
            self._flush_or_count()

    def _flush_or_count(self) -> None:
        """On the collector's thread: a write that fails must not stop the stream."""
        try:
            self._flush()
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
            self.lost += len(self._pending)
            self._pending = []

    def _flush(self) -> None:
        if not self._pending:
            return
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols = list(zip(*self._pending, strict=True))
        types = (pa.string(), pa.int32(), pa.int64(), pa.float64(), pa.string(), pa.string(), pa.float64())
        table = pa.table({name: pa.array(c, t) for name, c, t in zip(COLUMNS, cols, types, strict=True)})
        if self.path is None:
            self.path = os.path.abspath(self._where if isinstance(self._where, str) else self._where())
        os.makedirs(self.path, exist_ok=True)
        pq.write_table(table, os.path.join(self.path, f"part-{self._parts:05d}.parquet"))
        self._parts += 1
        self.written += len(self._pending)
        self._pending = []

    def parts(self) -> list[str]:
        return [os.path.join(self.path, f"part-{i:05d}.parquet") for i in range(self._parts)]

    def bytes(self) -> int:
        return sum(os.path.getsize(p) for p in self.parts())

    def tidy(self, run: str | None = None):
        """Every spilled row of ``run`` (None: all) as a tidy DataFrame, rollbacks applied."""
        import pandas as pd

        with self._lock:
            self._flush_or_count()
            parts = self.parts()
        if not parts:
            return pd.DataFrame(columns=list(COLUMNS))
        frame = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)  # in write order
        if run is not None:
            frame = frame[frame["run"] == run]
        marks = frame[frame["metric"] == ROLLBACK]
        keep = frame["metric"] != ROLLBACK
        for i, m in marks.iterrows():  # rows written before the mark, at or past its step
            keep &= ~(
                (frame["run"] == m["run"])
                & (frame["rank"] == m["rank"])
                & (frame["step"] >= m["step"])
                & (frame.index < i)
            )
        return frame[keep].reset_index(drop=True)


_IDS = frozenset({"run", "rank", "step", "time", "source"})
