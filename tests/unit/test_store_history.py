"""Tier 1: the store's bounded window, its Parquet history, and a recovered run filed as one."""

from workbench.notebook import metrics
from workbench.notebook.stream.history import History
from workbench.notebook.stream.store import EventStore
from workbench.shared import events


def _steps(run, steps, ranks=(0, 1), base=10.0):
    return [
        events.step_event(run=run, rank=r, step=i, metrics={"loss": base + i, "lr": 1e-3}) for i in steps for r in ranks
    ]


def test_rows_past_the_window_are_spilled_and_metrics_still_has_every_step(tmp_path):
    store = EventStore(20, history=History(str(tmp_path / "hist"), flush_every=16))
    for i in range(0, 100, 10):
        store.add(_steps("w", range(i + 1, i + 11)))
    fp = store.footprint()
    assert fp["rows"] <= 21 and fp["spilled"] == 200 - fp["rows"] and store.dropped_rows == 0
    assert store.history.parts() and store.history.written > 0  # on disk, in parts
    frame = metrics.metrics("w", store=store)
    loss = frame[frame["metric"] == "loss"]
    for r in (0, 1):
        got = loss[loss["rank"] == r]
        assert got["step"].tolist() == list(range(1, 101))
        assert got["value"].tolist() == [10.0 + i for i in range(1, 101)]
    wide = metrics.metrics("w", store=store, wide=True)
    assert len(wide) == 200 and set(wide.columns) >= {"run", "rank", "step", "loss", "lr"}


def test_a_rollback_into_spilled_rows_replaces_them(tmp_path):
    store = EventStore(10, history=History(str(tmp_path / "hist"), flush_every=4))
    store.add(_steps("rb", range(1, 41)))
    store.add(_steps("rb", range(21, 41), base=100.0))  # a checkpoint of step 20 loaded: 21.. again
    frame = metrics.metrics("rb", store=store)
    loss = frame[frame["metric"] == "loss"]
    for r in (0, 1):
        got = loss[loss["rank"] == r]
        assert got["step"].tolist() == list(range(1, 41))  # once each
        assert got["value"].tolist() == [10.0 + i for i in range(1, 21)] + [100.0 + i for i in range(21, 41)]


def test_a_store_without_history_drops_the_oldest_rows_and_counts_them():
    store = EventStore(10)
    store.add(_steps("d", range(1, 11)))
    assert len(store.rows) == 10 and store.dropped_rows == 10 and store.history is None


def test_a_recovered_trainer_continues_the_run_it_replaces():
    store = EventStore()
    store.add(_steps("first", range(1, 26)))
    store.continue_run("second", "first")
    store.add(_steps("second", range(21, 31), base=50.0))  # its own sequence numbers start at 0 again
    assert store.runs == ["first"] and store.duplicates == 0 and store.rollbacks == 2
    assert store.last_steps("first") == {0: 30, 1: 30}
    rows = store.snapshot_rows("first")
    assert sorted((r["rank"], r["step"]) for r in rows) == [(k, i) for k in (0, 1) for i in range(1, 31)]
    assert {r["loss"] for r in rows if r["step"] > 20} == {50.0 + i for i in range(21, 31)}
