"""Tier 1: an event store moved to another process (``%distrain detach``/``attach``) goes on as one.

The store travels pickled (``notebook.handoff``): its window, thinned series, duplicate check,
recoveries and the Parquet history it spills into (same folder, parts numbered on), not its
locks or listeners. The process that takes it adds on as if nothing had happened.
"""

import pickle
import threading

from workbench.notebook import metrics
from workbench.notebook.stream.history import History
from workbench.notebook.stream.store import EventStore
from workbench.shared import events


def _steps(run, steps, ranks=(0, 1)):
    return [events.step_event(run=run, rank=r, step=i, metrics={"loss": 10.0 + i}) for i in steps for r in ranks]


def test_a_store_pickled_mid_run_keeps_every_step_once_and_spills_into_the_same_history(tmp_path):
    folder = tmp_path / "metrics" / "night"
    store = EventStore(20, history=History(lambda: str(folder), flush_every=16))
    batches = _steps("r", range(1, 61))
    store.add(batches[:80])  # steps 1..40: some spilled to Parquet, some in the window
    store.note_recovery({"run": "r", "n": 1, "kind": "died"})
    store.subscribe(lambda rows: None)
    parts_before = len(store.history.parts())
    assert parts_before > 0

    moved = pickle.loads(pickle.dumps(store))
    assert isinstance(moved.lock, type(threading.Lock())) and moved.listeners == []
    assert moved.history.path == str(folder) and len(moved.history.parts()) == parts_before
    moved.add(batches[70:])  # the ranks' stream resumes in the new process, one batch sent twice
    assert moved.duplicates == 10 and moved.recoveries == [{"run": "r", "n": 1, "kind": "died"}]
    assert len(moved.history.parts()) > parts_before  # the same dataset, parts numbered on
    loss = metrics.metrics("r", store=moved)
    loss = loss[loss["metric"] == "loss"]
    for r in (0, 1):
        assert loss[loss["rank"] == r]["step"].tolist() == list(range(1, 61))


def test_a_history_not_yet_written_is_placed_when_it_moves(tmp_path):
    """The folder is named by a function (``ckpt dir`` may still change): decided at the move,
    so both processes would write the same dataset."""
    store = EventStore(100, history=History(lambda: str(tmp_path / "later"), flush_every=16))
    store.add(_steps("r", range(1, 5)))
    moved = pickle.loads(pickle.dumps(store))
    assert moved.history.path is None and moved.history._where == str(tmp_path / "later")
    moved.add(_steps("r", range(5, 80)))
    assert moved.history.path == str(tmp_path / "later") and moved.history.parts()
