"""Tier 1: the event schema and the notebook's store, without processes."""
import math

import pytest

from workbench import events
from workbench.stream.store import EventStore, Thinned


def test_roundtrip_keeps_nan_and_inf():
    e = events.step_event(run="r", rank=0, step=1, metrics={"loss": float("nan"), "grad_norm": float("inf"), "lr": 1e-3},
                          comm={"all_reduce": {"count": 2, "bytes": 8, "time_s": 0.1}})
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


def test_thinned_series_stays_bounded_and_spans_the_run():
    t = Thinned(limit=100)
    for i in range(100_000):
        t.add(i, float(i))
    assert len(t.xs) <= 200 and t.xs[0] == 0 and t.xs[-1] > 99_000
