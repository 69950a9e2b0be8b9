"""Tier 1: the event schema and the notebook's store, without processes."""

import math

import pytest

from workbench.notebook.stream.store import EventStore, Thinned
from workbench.shared import events


def test_roundtrip_keeps_nan_and_inf():
    e = events.step_event(
        run="r",
        rank=0,
        step=1,
        metrics={"loss": float("nan"), "grad_norm": float("inf"), "lr": 1e-3},
        comm={"all_reduce": {"count": 2, "bytes": 8, "time_s": 0.1}},
    )
    back = events.decode(events.encode([e]))[0]
    flat = events.flat_metrics(back)
    assert math.isnan(flat["loss"]) and flat["grad_norm"] == math.inf and flat["lr"] == 1e-3
    assert flat["comm/all_reduce/bytes"] == 8


def test_other_schema_version_is_refused_with_advice():
    e = events.log_event(run="r", rank=3, text="x")
    e["v"] = 99
    with pytest.raises(events.SchemaError, match="restart the ranks"):
        events.decode(events.encode([e]))


def test_store_drops_duplicates_and_counts_gaps():
    store = EventStore()
    evs = [events.step_event(run="gap", rank=0, step=i, metrics={"loss": 1.0}) for i in range(1, 6)]
    store.add(evs[:2])
    store.add([evs[1]])  # a duplicate
    store.add(evs[3:])  # evs[2] lost
    assert store.duplicates == 1 and store.gaps == 1
    assert [r["step"] for r in store.snapshot_rows("gap")] == [1, 2, 4, 5]


def test_a_rolled_back_run_shows_the_re_run_and_keeps_what_it_replaced():
    store = EventStore()
    first = [
        events.step_event(run="rb", rank=r, step=i, metrics={"loss": 10.0 + i}) for i in range(1, 11) for r in (0, 1)
    ]
    store.add(first)
    # a checkpoint of step 6 is loaded: steps 7.. come again, with new sequence numbers
    again = [
        events.step_event(run="rb", rank=r, step=i, metrics={"loss": 1.0 + i}) for i in range(7, 9) for r in (0, 1)
    ]
    store.add(again)
    assert (store.rollbacks, store.duplicates, store.gaps) == (2, 0, 0)  # once per rank
    rows = store.snapshot_rows("rb")
    assert sorted((r["rank"], r["step"]) for r in rows) == [(k, i) for k in (0, 1) for i in range(1, 9)]
    assert {r["loss"] for r in rows if r["step"] >= 7} == {8.0, 9.0}  # the re-run's values
    assert store.line("rb", "loss", 0) == (list(range(1, 9)), [11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 8.0, 9.0])
    assert store.last_steps("rb") == {0: 8, 1: 8}  # where the run stands, not the highest step seen
    assert sorted((r["rank"], r["step"]) for r in store.superseded) == [(k, i) for k in (0, 1) for i in range(7, 11)]
    store.add([again[0]])  # the same event twice is still a duplicate, not a rollback
    assert (store.rollbacks, store.duplicates) == (2, 1)


def test_user_reports_of_one_step_are_all_kept():
    store = EventStore()
    store.add(
        [
            events.step_event(run="u", rank=0, step=5, metrics={"loss": 1.0}, source="user"),
            events.step_event(run="u", rank=0, step=5, metrics={"accuracy": 0.5}, source="user"),
        ]
    )
    assert len(store.snapshot_rows("u")) == 2 and store.rollbacks == 0 and store.duplicates == 0


def test_thinned_series_stays_bounded_and_spans_the_run():
    t = Thinned(limit=100)
    for i in range(100_000):
        t.add(i, float(i))
    assert len(t.xs) <= 200 and t.xs[0] == 0 and t.xs[-1] > 99_000


def test_thinned_arrays_follow_the_lists_through_appends_thinning_and_truncation():
    """The dashboard's arrays are extended incrementally: they must always equal the lists."""
    import numpy as np

    t = Thinned(limit=10)

    def check():
        xs, ys = t.arrays()
        assert xs.dtype == ys.dtype == np.float64 and not xs.flags.writeable and not ys.flags.writeable
        assert xs.tolist() == [float(x) for x in t.xs] and ys.tolist() == [float(y) for y in t.ys]
        return xs

    for i in range(15):
        t.add(i, i * 0.5)
    first = check()
    assert check() is first  # nothing added: the same arrays, no copy
    for i in range(15, 21):  # 21 points > 2 x limit: thinned (the lists are replaced)
        t.add(i, i * 0.5)
        check()
    assert t.stride == 2
    t.truncate(10)
    check()
    t.add(10, 99.0)
    check()
