"""One session's event stream mirrored into one experiment tracker run.

The tracker subscribes to the session's store as the dashboard reads it: every step row the
store keeps is queued by the collector's thread and written by a thread of this tracker, so a
slow tracker (MLflow's database, W&B's service) never holds up the stream. Rows already in the
store come first: a tracker started after training has the whole run. A step is written once
every rank has reported it (or when many wait, or at close); what is written, under which
names: docs/trackers.md. A detached set's trackers go with it (:meth:`Tracker.carry`).
"""

from __future__ import annotations

import fnmatch
import queue
import threading
import time
from collections import OrderedDict

from ..stream.store import ID_COLUMNS

MAX_WAITING_STEPS = 256  # steps held for a rank that has not reported: past this, written as they are
CHECKPOINT_SCAN_S = 5.0
IDLE_WAKE_S = 2.0  # trackers with artifacts: look for new checkpoints, write what is buffered


def series_name(run: str, metric: str, rank: int | str) -> str:
    """The tracker's name of one series: ``<run>/<metric>/rank<r>`` or ``<run>/<metric>/mean``."""
    return f"{run}/{metric}/{rank if rank == 'mean' else f'rank{rank}'}"


def wanted(metric: str, patterns: tuple[str, ...] | None) -> bool:
    """Whether ``metric`` is mirrored: every metric without patterns, else those matching one."""
    return patterns is None or any(fnmatch.fnmatchcase(metric, p) for p in patterns)


def step_values(run: str, by_rank: dict[int, dict], patterns: tuple[str, ...] | None = None) -> dict[str, float]:
    """One step of one run as tracker values: each rank's numbers and their mean."""
    out: dict[str, float] = {}
    sums: dict[str, list] = {}
    for rank in sorted(by_rank):
        for metric, value in by_rank[rank].items():
            if metric in ID_COLUMNS or value is None or not wanted(metric, patterns):
                continue
            value = float(value)
            out[series_name(run, metric, rank)] = value
            sums.setdefault(metric, []).append(value)
    for metric, values in sums.items():
        out[series_name(run, metric, "mean")] = sum(values) / len(values)
    return out


class Tracker:
    """The mirror of one session into one backend (see the module docstring)."""

    def __init__(
        self, backend, session, directory: str, metrics: tuple[str, ...] | None = None, *, carried: dict | None = None
    ):
        self.backend = backend
        self.metrics = metrics
        self.name = backend.name
        self.session = session
        self.directory = directory
        self.world = session.rankset.world_size if session.rankset is not None else 1
        self.steps_written = 0
        self.artifacts: list[str] = []
        self.errors: list[str] = []
        self._queue: queue.Queue = queue.Queue()
        self._waiting: OrderedDict = OrderedDict()  # (run, step) -> {rank: row}
        self._runs: set[str] = set()
        self._next_scan = 0.0
        self._closed = threading.Event()
        self._carrying = False
        self.started = time.time()
        if carried is not None:
            self._take_over(carried)
            return
        self.store = _store_of(session)  # refuses a session with nothing to mirror, before opening
        # the tracker run: the session's name and when tracking began, so tracking the same
        # session again (or another kernel's session of the same name) is a run of its own
        now = time.time()
        self.run_name = (
            f"{session.name}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now))}-{int(now * 1000) % 1000:03d}"
        )
        backend.open(self.run_name, directory, session_params(session))
        self._order = threading.Lock()  # the rows kept so far are queued before any later batch
        with self._order:
            for row in self.store.subscribe(self._offer):
                self._queue.put(row)
        self._start_thread()

    def _start_thread(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"workbench-tracker-{self.name}", daemon=True)
        self._thread.start()

    # --------------------------------------------------------------- carried to another process
    def carry(self, timeout: float = 60.0) -> dict:
        """Stop mirroring here without ending the tracker run: everything queued is written,
        the steps still waiting for a rank are kept; plain data for :meth:`resumed`, whose
        process writes only rows that reach its store afterwards, so every step lands in the
        same tracker run once."""
        self._carrying = True
        self._closed.set()
        self.store.unsubscribe(self._offer)
        self._queue.put(StopIteration)
        self._thread.join(timeout)
        return {
            "kind": self.name,
            "directory": self.directory,
            "metrics": self.metrics,
            "world": self.world,
            "run_name": self.run_name,
            "started": self.started,
            "steps_written": self.steps_written,
            "artifacts": list(self.artifacts),
            "errors": list(self.errors),
            "waiting": list(self._waiting.items()),
            "runs": sorted(self._runs),
            "backend": self.backend.carry(),
        }

    @classmethod
    def resumed(cls, backend, session, carried: dict) -> Tracker:
        """The tracker :meth:`carry` gave, writing on into the same run from the session's store:
        only rows that reach the store from now on (the earlier ones were written, or wait)."""
        return cls(backend, session, carried["directory"], carried["metrics"], carried=carried)

    def _take_over(self, c: dict) -> None:
        self.world, self.run_name, self.started = c["world"], c["run_name"], c["started"]
        self.steps_written, self.artifacts, self.errors = c["steps_written"], list(c["artifacts"]), list(c["errors"])
        self._waiting = OrderedDict((tuple(k), v) for k, v in c["waiting"])
        self._runs = set(c["runs"])
        self.store = self.session.store
        self.backend.resume(c["backend"])
        self._order = threading.Lock()
        self.store.subscribe(self._offer)  # the rows it returns were the giver's
        self._start_thread()

    def _offer(self, rows: list[dict]) -> None:  # the collector's thread: queue only
        with self._order:
            for row in rows:
                self._queue.put(row)

    # --------------------------------------------------------------- the thread
    def _run(self) -> None:
        from ..background import lower_this_thread

        lower_this_thread()  # gives way to ranks training on the same cores
        while True:
            try:  # a tracker with nothing to do later sleeps until rows come (no idle wake-ups)
                row = self._queue.get(timeout=IDLE_WAKE_S if self.backend.has_artifacts else None)
            except queue.Empty:
                row = None
            if row is StopIteration:
                break
            if isinstance(row, threading.Event):  # flush(): everything before it is taken
                row.set()
                continue
            try:
                if row is not None:
                    self._take(row)
                    while True:  # what else is queued, in one go
                        try:
                            more = self._queue.get_nowait()
                        except queue.Empty:
                            break
                        if more is StopIteration or isinstance(more, threading.Event):
                            self._queue.put(more)  # handled by the outer loop, in order
                            break
                        self._take(more)
                self.backend.flush()  # also when idle: a buffering tracker writes what is due
                self._scan_checkpoints()
            except Exception as exc:  # a tracker failure is reported, never kills the mirror
                self.errors.append(f"{type(exc).__name__}: {exc}")
        try:
            while self._waiting and not self._carrying:  # carried: they wait on in the next process
                self._write(*self._waiting.popitem(last=False))
            self.backend.flush()
            self._scan_checkpoints(force=True)
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")

    def _take(self, row: dict) -> None:
        run = row["run"]
        if run not in self._runs:
            self._runs.add(run)
            self.backend.params(run_params(self.session, run, row["source"]))
        key = (run, row["step"])
        ranks = self._waiting.setdefault(key, {})
        if row["rank"] in ranks:  # a second record of this rank at this step (an eval log): write the first
            self._write(key, self._waiting.pop(key))
            ranks = self._waiting.setdefault(key, {})
        ranks[row["rank"]] = row
        if len(ranks) >= self.world:
            self._write(key, self._waiting.pop(key))
        while len(self._waiting) > MAX_WAITING_STEPS:
            self._write(*self._waiting.popitem(last=False))

    def _write(self, key: tuple, by_rank: dict) -> None:
        run, step = key
        wall = max(r["time"] for r in by_rank.values())
        self.backend.log(run, step, step_values(run, by_rank, self.metrics), wall)
        self.steps_written += 1

    def _scan_checkpoints(self, force: bool = False) -> None:
        if not self.backend.has_artifacts or (not force and time.monotonic() < self._next_scan):
            return
        self._next_scan = time.monotonic() + CHECKPOINT_SCAN_S
        import os

        from ...shared.checkpoint import catalog

        root = self.session.checkpoint_dir
        if not os.path.isdir(root):
            return
        for folder, manifest in catalog.entries(root):
            # only this tracker's time: the folder may hold older sessions' checkpoints
            if folder not in self.artifacts and manifest.time >= self.started:
                self.backend.artifact(folder)
                self.artifacts.append(folder)

    # --------------------------------------------------------------- control
    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every row queued so far is taken (steps still waiting for a rank stay)."""
        done = threading.Event()
        self._queue.put(done)
        return done.wait(timeout)

    def close(self, timeout: float = 60.0) -> None:
        """Write what is waiting (also steps some rank never reported), then end the run."""
        if self._closed.is_set():
            return
        self._closed.set()
        self.store.unsubscribe(self._offer)
        self._queue.put(StopIteration)
        self._thread.join(timeout)
        try:
            self.backend.close()
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def info(self) -> dict:
        return {
            "session": self.session.name,
            "tracker": self.name,
            "run": self.run_name,
            "dir": self.directory,
            "metrics": ",".join(self.metrics) if self.metrics else "all",
            "where": self.backend.where(),
            "steps": self.steps_written,
            "artifacts": len(self.artifacts),
            "errors": list(self.errors),
            "open": not self.closed,
        }

    def __repr__(self) -> str:
        state = "open" if not self.closed else "closed"
        return f"<Tracker {self.name} of session {self.session.name!r}: {self.steps_written} steps, {state}>"


def _store_of(session):
    from .. import stream

    if session.running:
        return stream.attach(session.rankset).store
    if session.store is None:
        from .backends import TrackerError

        raise TrackerError(
            f"session {session.name!r} has no ranks running and no steps kept: start it first "
            "(`%distrain start -n 2`), then track"
        )
    return session.store


def _plain(value):
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


def session_params(session) -> dict:
    """The layout of the session's rank set, as tracker parameters."""
    out = {"session": session.name}
    rs = session.rankset
    if rs is not None:
        out["world_size"] = rs.world_size
        config = getattr(rs, "config", None)
        for field in ("backend", "launcher", "threads", "hosts"):
            value = getattr(config, field, None)
            if value is not None:
                out[field] = _plain(value)
    return out


def run_params(session, run: str, source: str) -> dict:
    """A run's setup (strategy, model, options of ``train.setup``) as parameters under ``<run>/``."""
    out = {f"{run}/source": source}
    if source == "trainer" and session.setup.recipe:
        for key, value in session.setup.recipe.items():
            out[f"{run}/{key}"] = _plain(value)
    return out
