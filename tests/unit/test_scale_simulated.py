"""Tier 1: the notebook side with 1024 SIMULATED ranks (tests/sim_ranks.py: real events over a real
collector, no rank processes): every event kept, the dashboard drawn as bands, output grouped."""

import math

import pytest
from sim_ranks import RUN, SimulatedPublishers, cell_replies, wait_received

from workbench.notebook.dashboard import bands, figures
from workbench.notebook.stream import Collector

N = 1024
SLOW, NAN = 777, 123


@pytest.fixture(scope="module")
def store():
    collector = Collector()
    pubs = SimulatedPublishers(collector, N, slow_ranks={SLOW}, nan_ranks={NAN})
    try:
        pubs.steps(12)
        assert wait_received(collector.store, 12 * N), collector.store.received
        yield collector.store
    finally:
        pubs.close()
        collector.close()


def test_every_event_of_1024_ranks_is_kept_once(store):
    assert store.received == 12 * N
    assert store.gaps == 0 and store.duplicates == 0
    assert store.ranks(RUN) == list(range(N))
    assert all(store.last_step[(RUN, r)] == 11 for r in range(N))


def test_past_the_threshold_per_rank_panels_are_a_band_the_median_and_the_outliers(store):
    lines = figures.lines_for(store, RUN)
    loss = {name: (xs, ys, style) for name, xs, ys, style in lines["loss"]}
    assert set(loss) == {"min", "max", "median", "mean", "outlier 1", "outlier 2", "outlier 3"}
    lo, mid, hi = loss["min"][1], loss["median"][1], loss["max"][1]
    assert len(mid) == 12 and (lo <= mid).all() and (mid <= hi).all()
    # the rank whose loss is NaN strays furthest and is drawn on its own, named
    assert loss["outlier 1"][2]["label"] == f"rank {NAN}" and all(math.isnan(v) for v in loss["outlier 1"][1])
    tps = {name: style for name, _, _, style in lines["throughput"]}
    assert tps["outlier 1"]["label"] == f"rank {SLOW}"  # the straggler's throughput
    comm = [name for name, *_ in lines["comm"]]
    assert comm == ["all_reduce median", "all_reduce max"]
    traces = sum(len(v) for v in lines.values())
    assert traces < 40, traces  # not 1024 lines a panel


def test_the_figure_has_fixed_slots_and_a_redraw_relabels_them(store):
    fig = figures.make_figure(widget=False, ranks=range(N))
    before = len(fig.data)
    assert before < 40
    figures.draw(fig, figures.lines_for(store, RUN))
    names = {t.meta: t.name for t in fig.data}
    assert len(fig.data) == before + 2  # the two collective lines appear with their data
    assert names["loss:outlier 1"] == f"rank {NAN}" and names["throughput:outlier 1"] == f"rank {SLOW}"
    max_trace = next(t for t in fig.data if t.meta == "loss:max")
    assert max_trace.fill == "tonexty"


def test_small_sets_keep_a_line_per_rank():
    assert not bands.banded(bands.BAND_PAST) and bands.banded(bands.BAND_PAST + 1)
    names = [name for name, _ in figures.expected_traces(range(4))["loss"]]
    assert names == ["rank 0", "rank 1", "rank 2", "rank 3", "mean"]


def test_a_cell_on_1024_ranks_prints_a_few_grouped_lines(capsys):
    from workbench.notebook.cluster.cell import show_grouped

    rest, displays, failures = cell_replies(N, odd_ranks={5, 900}, failing=set(range(512, 1024)))
    show_grouped(list(range(N)), rest, displays, [None] * N, failures)
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == "[ranks 0-4,6-899,901-1023] step 100 done"
    assert len(out.splitlines()) == 3
    assert err.splitlines() == ["[ranks 512-1023] Traceback...", "[ranks 512-1023] ValueError: bad batch"]
