"""Where the notebook keeps what the ranks sent: every step row, and thinned series for plots.

Two copies, for two readers. ``rows`` holds every step record of every rank for
``workbench.metrics()`` (bounded by ``max_rows``: the oldest spilled to a Parquet ``history``
when the store has one, else dropped and counted); ``series`` holds, per (run, metric, rank), at
most 2 x ``max_points`` points (:class:`Thinned`), so a redraw costs the same at any step.
Duplicates (a run, rank and sequence number already seen) are dropped and counted, gaps in a
rank's sequence numbers counted: "no steps lost" is checked, not assumed.
"""

from __future__ import annotations

import sys
import threading
import time
from array import array
from collections import deque

from ...shared import events

ID_COLUMNS = ("run", "rank", "step", "time", "source")


class Thinned:
    """One plotted line: x/y that keep every ``stride``-th point, the stride doubled whenever they
    pass 2 x ``limit`` points.

    Held as ``array('d')``, 8 bytes a value and no object per point: a dashboard of many ranks
    holds hundreds of lines (docs/unattended.md, "Hours without growth").
    """

    __slots__ = ("xs", "ys", "stride", "n", "limit", "_arrays")

    def __init__(self, limit: int):
        self.xs = array("d")
        self.ys = array("d")
        self.stride = 1
        self.n = 0
        self.limit = limit
        self._arrays = None  # (xs, ys, the list they were made from) of the last arrays() call

    def arrays(self):
        """x and y as read-only float64 arrays, for plotting.

        A redraw asks for every line twice a second while a run streams, on the cores the ranks
        train on: rather than converting the whole lists each time, the arrays of the last call
        are extended by the points added since, and rebuilt only after a thinning or a
        truncation (both replace the lists). Read-only because they are shared: the figure holds
        the ones it was given.
        """
        import numpy as np

        n = len(self.xs)
        cached = self._arrays
        if cached is not None and cached[2] is self.xs and len(cached[0]) <= n:
            have = len(cached[0])
            if have == n:
                return cached[0], cached[1]
            # copies: an array('d') cannot grow while numpy holds a view of its buffer
            xs = np.concatenate([cached[0], np.array(self.xs[have:], dtype=np.float64)])
            ys = np.concatenate([cached[1], np.array(self.ys[have:], dtype=np.float64)])
        else:
            xs, ys = np.array(self.xs, dtype=np.float64), np.array(self.ys, dtype=np.float64)
        xs.flags.writeable = ys.flags.writeable = False
        self._arrays = (xs, ys, self.xs)
        return xs, ys

    def add(self, x, y) -> None:
        if self.n % self.stride == 0:
            self.xs.append(x)
            self.ys.append(y)
            if len(self.xs) > 2 * self.limit:
                self.xs, self.ys = self.xs[::2], self.ys[::2]
                self.stride *= 2
        self.n += 1

    def truncate(self, x) -> None:
        """Forget the points at ``x`` and after (their count too, as far as the stride tells)."""
        keep = sum(1 for v in self.xs if v < x)
        dropped = len(self.xs) - keep
        self.xs, self.ys = self.xs[:keep], self.ys[:keep]
        self.n = max(0, self.n - dropped * self.stride)


class EventStore:
    """Thread-safe: the collector thread adds, the notebook and dashboard read."""

    def __init__(self, max_rows: int = 1_000_000, max_points: int = 1000, *, history=None):
        self.lock = threading.Lock()
        self.history = history  # a stream.history.History: rows past the window go there
        self.window = max_rows
        self.spilled = 0  # rows moved to the history
        self.rows: deque = deque(maxlen=None if history is not None else max_rows)
        self.max_points = max_points
        self.series: dict[tuple, Thinned] = {}
        self.states: dict[str, dict[int, dict]] = {}  # run -> rank -> last status event
        self.statuses: list[dict] = []
        self.logs: deque = deque(maxlen=1000)
        self.runs: list[str] = []
        self.superseded: deque = deque(maxlen=max(1, max_rows // 10))  # rows a rollback replaced
        self.rollbacks = 0
        self._seen: set = set()  # (run, rank, seq) of the latest events kept (duplicates are recent)
        self._seen_order: deque = deque()
        self._seen_limit = max(100_000, 2 * max_rows)
        self._last_seq: dict = {}
        self.duplicates = 0
        self.gaps = 0
        self.received = 0
        self.lag_s = 0.0  # receive time minus rank time of the latest event
        self.version = 0
        self.last_step: dict[tuple, int] = {}  # (run, rank) -> latest step received
        self._trainer_step: dict[tuple, int] = {}  # (run, rank) -> latest trainer step
        self.changed = threading.Condition()
        self.aliases: dict[str, str] = {}  # run id of a recovered trainer -> the run it continues
        self.recoveries: list[dict] = []  # what a failure budget's supervisor did, oldest first
        self.listeners: list = []  # fn(new step rows), called on the adding thread (trackers)

    def __getstate__(self) -> dict:
        """Everything kept, for the process that takes a detached set over (``notebook.handoff``);
        not the locks, nor the listeners (they belong to the process that subscribed them)."""
        with self.lock:
            state = dict(self.__dict__)
        for name in ("lock", "changed", "listeners"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.lock = threading.Lock()
        self.changed = threading.Condition()
        self.listeners = []

    @property
    def dropped_rows(self) -> int:
        return max(0, self._n_rows - len(self.rows) - self.spilled)

    _n_rows = 0

    def add(self, batch: list[dict]) -> None:
        now = time.time()
        new: list[dict] = []
        with self.lock:
            for e in batch:
                self._check_seq(e)
                if e["run"] in self.aliases:  # sequence numbers stay the trainer's own (see continue_run)
                    e = {**e, "run": self.aliases[e["run"]], "sent_as": e["run"]}
                run = e["run"]
                if run not in self.states:
                    self.states[run] = {}
                    self.runs.append(run)
                kind = e["kind"]
                if kind == "step":
                    row = self._add_step(e)
                    if row is not None:
                        new.append(row)
                elif kind == "status":
                    self.states[run][e["rank"]] = e
                    self.statuses.append(e)
                else:
                    self.logs.append(e)
                self.lag_s = now - e["time"]
            self.received += len(batch)
            self.version += 1
            listeners = list(self.listeners) if new else ()
        for fn in listeners:
            fn(new)
        with self.changed:
            self.changed.notify_all()

    def subscribe(self, fn) -> list[dict]:
        """Call ``fn(rows)`` with the step rows of every later batch (on the collector's thread:
        ``fn`` must only queue them); returns the rows kept so far, with no gap or overlap."""
        with self.lock:
            self.listeners.append(fn)
            return list(self.rows)

    def unsubscribe(self, fn) -> None:
        with self.lock:
            if fn in self.listeners:
                self.listeners.remove(fn)

    def _check_seq(self, e: dict) -> None:
        key = (e["run"], e["rank"])
        last = self._last_seq.get(key)
        if last is not None and e["seq"] > last + 1:
            self.gaps += e["seq"] - last - 1
        self._last_seq[key] = max(e["seq"], last if last is not None else -1)

    def _add_step(self, e: dict) -> dict | None:
        # one run-id string for every key and row of the run (each event decodes its own copy)
        run = sys.intern(e["run"])
        sent = e.get("sent_as")
        key = (run if sent is None else sys.intern(sent), e["rank"], e["seq"])
        if key in self._seen:
            self.duplicates += 1
            return None
        self._seen.add(key)
        self._seen_order.append(key)
        if len(self._seen_order) > self._seen_limit:
            self._seen.discard(self._seen_order.popleft())
        before = self._trainer_step.get((e["run"], e["rank"]))  # None: the rank's first step, nothing to move
        if e["source"] == "trainer" and before is not None and e["step"] <= before:
            self._roll_back(e["run"], e["rank"], e["step"])
        if e["source"] == "trainer":
            self._trainer_step[(e["run"], e["rank"])] = e["step"]
        flat = events.flat_metrics(e)
        row = {"run": run, "rank": e["rank"], "step": e["step"], "time": e["time"], "source": e["source"], **flat}
        self.rows.append(row)
        self._n_rows += 1
        if self.history is not None and len(self.rows) > self.window:
            self.history.add_row(self.rows.popleft())
            self.spilled += 1
        rank, step = e["rank"], e["step"]
        self.last_step[(run, rank)] = (
            step if e["source"] == "trainer" else max(step, self.last_step.get((run, rank), 0))
        )
        for name, value in flat.items():
            if value is None:
                continue
            s = self.series.get((run, name, rank))
            if s is None:
                s = self.series[(run, name, rank)] = Thinned(self.max_points)
            s.add(step, value)
        return row

    def _roll_back(self, run: str, rank: int, step: int) -> None:
        """Move this rank's rows and points of ``run`` from ``step`` on aside.

        A trainer step that comes again with a new sequence number is a re-run: a checkpoint was
        loaded into the running run (a rollback after a NaN), and the trainer goes on from the
        checkpoint's step. The run as it now stands is what ``metrics()`` and the plots show: the
        rows from that step on go to ``superseded`` (kept, for a look at what was rolled back)
        and ``rollbacks`` is counted."""
        self.rollbacks += 1
        kept = deque(maxlen=self.rows.maxlen)
        for r in self.rows:
            if r["run"] == run and r["rank"] == rank and r["step"] >= step:
                self.superseded.append(r)
            else:
                kept.append(r)
        self._n_rows -= len(self.rows) - len(kept)
        self.rows = kept
        if self.history is not None and self.spilled:
            self.history.roll_back(run, rank, step, time.time())
        for (r, _name, k), line in self.series.items():
            if r == run and k == rank:
                line.truncate(step)

    def continue_run(self, new_run: str, run: str) -> None:
        """File ``new_run``'s events under ``run`` from now on: a recovery (``notebook.runs.budget``)
        rebuilds the trainer on new ranks, which names a new run, and it goes on with the run it
        replaces; its first step (the loaded checkpoint's next) moves the redone steps aside as a
        rollback does, so the recovered run is one run with every step once. Duplicates are still
        told by the sender's id."""
        with self.lock:
            self.aliases[new_run] = self.aliases.get(run, run)

    def note_recovery(self, record: dict) -> None:
        """Keep a recovery's record where the dashboard and ``train status`` read it."""
        with self.lock:
            self.recoveries.append(dict(record))
            self.version += 1
        with self.changed:
            self.changed.notify_all()

    # ------------------------------------------------------------------ reading
    def footprint(self) -> dict[str, int]:
        """How much the store holds in memory, by part (what a soak run watches stay flat)."""
        with self.lock:
            return {
                "rows": len(self.rows),
                "points": sum(len(t.xs) for t in self.series.values()),
                "lines": len(self.series),
                "seen": len(self._seen),
                "statuses": len(self.statuses),
                "logs": len(self.logs),
                "superseded": len(self.superseded),
                "spilled": self.spilled,
            }

    def latest_run(self) -> str | None:
        with self.lock:
            return self.runs[-1] if self.runs else None

    def line(self, run: str, metric: str, rank: int) -> tuple[list, list]:
        with self.lock:
            s = self.series.get((run, metric, rank))
            return (list(s.xs), list(s.ys)) if s else ([], [])

    def arrays(self, run: str, metric: str, rank: int):
        """The plotted line as read-only float64 arrays (see :meth:`Thinned.arrays`)."""
        with self.lock:
            s = self.series.get((run, metric, rank))
            if s is not None:
                return s.arrays()
        import numpy as np

        return np.empty(0), np.empty(0)

    def last(self, run: str, metric: str, rank: int):
        """The latest plotted value of a line (None if it has none)."""
        with self.lock:
            s = self.series.get((run, metric, rank))
            return s.ys[-1] if s is not None and s.ys else None

    def metric_names(self, run: str) -> list[str]:
        with self.lock:
            return sorted({m for (r, m, _rank) in self.series if r == run})

    def ranks(self, run: str) -> list[int]:
        with self.lock:
            return sorted({k for (r, _m, k) in self.series if r == run} | set(self.states.get(run, {})))

    def run_state(self, run: str, since: int = 0) -> dict[int, dict]:
        """rank -> latest status event of ``run`` (only among status events number ``since`` on)."""
        with self.lock:
            if not since:
                return dict(self.states.get(run, {}))
            out = {}
            for e in self.statuses[since:]:
                if e["run"] == run:
                    out[e["rank"]] = e
            return out

    def last_steps(self, run: str) -> dict[int, int]:
        with self.lock:
            return {rank: st for (r, rank), st in self.last_step.items() if r == run}

    def snapshot_rows(self, run: str | None = None) -> list[dict]:
        with self.lock:
            return [r for r in self.rows if run is None or r["run"] == run]

    def wait(self, predicate, timeout: float) -> bool:
        """Block until ``predicate(store)`` holds (checked at each batch) or ``timeout``."""
        deadline = time.monotonic() + timeout
        while not predicate(self):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with self.changed:
                self.changed.wait(min(left, 0.25))
        return True
