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


def test_the_heatmaps_show_the_slow_and_the_nan_rank_of_1024(store):
    import numpy as np

    lines = figures.lines_for(store, RUN)
    ((name, steps, starts, style),) = lines["step_map"]
    z = style["z"]
    assert name == "step time" and z.shape == (bands.MAP_ROWS, 12) and list(steps) == list(range(12))
    slow_row = list(starts).index(SLOW - SLOW % 8)  # the bin of 8 ranks holding the slow rank
    assert (z[slow_row] > 2 * np.delete(z, slow_row, axis=0).max(axis=0)).all()
    ((_, _, loss_starts, loss_style),) = lines["loss_map"]
    nan_row = list(loss_starts).index(NAN - NAN % 8)
    assert np.isnan(loss_style["z"][nan_row]).all() and not np.isnan(np.delete(loss_style["z"], nan_row, axis=0)).any()
    # drawn into the figure's heatmap traces, and a second redraw with nothing new sends nothing
    fig = figures.make_figure(widget=True, ranks=range(N))
    figures.draw(fig, lines)
    drawn = next(t for t in fig.data if t.meta == "step_map:step time")
    assert np.array_equal(np.asarray(drawn.z), z)
    edits = fig._last_trace_edit_id
    assert edits > 0  # the first draw sent its restyles
    figures.draw(fig, figures.lines_for(store, RUN))
    assert fig._last_trace_edit_id == edits
    # the standalone page (Dashboard.export_html) draws them too
    static = figures.make_figure(widget=False, ranks=store.ranks(RUN))
    figures.draw(static, lines)
    maps = [t for t in static.data if t.type == "heatmap" and t.z is not None and len(t.z)]
    assert [t.meta for t in maps] == ["loss_map:loss", "step_map:step time"]
    assert '"meta":"step_map:step time"' in static.to_html(include_plotlyjs=False)
