"""Tier 1: the pictures past 16 ranks, from data at the ranks' own schemas (a SIMULATION of up to
1024 ranks; no rank processes): the rank x step heatmaps stay bounded and still show one slow
or NaN rank, the timeline draws the extremes and the straggler, the layout groups its ranks."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sim_ranks import LAYOUT_ROWS, layout_param, layouts, timeline_records

from workbench.notebook.dashboard import bands, figures
from workbench.notebook.dashboard.layout_figure import layout_figure, rank_groups, tensor_figure
from workbench.notebook.dashboard.timeline_figure import EXTREMES, extreme_ranks, stragglers, timeline_figure


# ---------------------------------------------------------------- rank x step heatmaps
def _lines(n_ranks: int, n_steps: int, *, slow: int, nan: int | None = None, step_s: float = 0.25):
    steps = np.arange(n_steps, dtype=float)
    out = []
    for r in range(n_ranks):
        ys = np.full(n_steps, step_s) + 0.001 * (r % 7)
        if r == slow:
            ys[n_steps // 2 :] = 3 * step_s  # slow from half-way on
        if r == nan:
            ys[-1] = math.nan
        out.append((steps, ys))
    return out


def test_the_heatmap_of_1024_ranks_by_5000_steps_is_bounded_and_shows_the_slow_rank():
    n, steps, slow = 1024, 5000, 777
    found = bands.heatmap(_lines(n, steps, slow=slow, nan=5), list(range(n)))
    step_bins, rank_starts, z, labels = found
    assert z.shape == (bands.MAP_ROWS, bands.MAP_COLUMNS)  # not 1024 x 5000
    assert len(step_bins) == bands.MAP_COLUMNS and step_bins[0] == 0 and step_bins[1] == 25
    assert rank_starts[:3] == [0, 8, 16] and labels[:2] == ["ranks 0-7", "ranks 8-15"]
    # the slow rank's bin is slow from half-way on, and only there; every other bin is not
    row = rank_starts.index(776)
    assert labels[row] == "ranks 776-783"
    assert (z[row, bands.MAP_COLUMNS // 2 :] > 0.7).all() and (z[row, : bands.MAP_COLUMNS // 2] < 0.3).all()
    others = np.delete(z, row, axis=0)
    assert np.nanmax(others) < 0.3
    # the rank with a NaN step makes its bin's last step bin NaN (a gap), not an average over it
    assert math.isnan(z[0, -1]) and not np.isnan(np.delete(z, 0, axis=0)).any()


def test_a_heatmap_of_few_steps_and_ranks_has_a_cell_each():
    found = bands.heatmap(_lines(20, 12, slow=3), list(range(20)))
    step_bins, rank_starts, z, labels = found
    assert z.shape == (20, 12) and rank_starts == list(range(20)) and labels[3] == "rank 3"
    assert (z[3, 6:] > 0.7).all()
    assert bands.heatmap([(np.empty(0), np.empty(0))] * 3, [0, 1, 2]) is None


def test_the_dashboard_gets_its_heatmaps_past_the_threshold_only():
    small = figures.make_figure(widget=False, ranks=range(bands.BAND_PAST))
    assert not [t for t in small.data if t.type == "heatmap"]
    assert len(small.layout.annotations) == len(figures.PANELS)
    big = figures.make_figure(widget=False, ranks=range(1024))
    maps = [t for t in big.data if t.type == "heatmap"]
    assert [t.meta for t in maps] == ["loss_map:loss", "step_map:step time"]
    assert [a.text for a in big.layout.annotations][-2:] == [p.title for p in figures.HEATMAPS]
    # each heatmap on its own axes, ranks down the side (rank 0 on top)
    assert {(t.xaxis, t.yaxis) for t in maps} == {("x7", "y7"), ("x8", "y8")}
    assert big.layout.yaxis7.autorange == "reversed" and big.layout.yaxis8.autorange == "reversed"


# ---------------------------------------------------------------- the timeline
def test_past_the_threshold_the_timeline_draws_the_extremes_and_the_straggler_named():
    recs = timeline_records(256, 3, slow=200, fast=17)
    assert set(stragglers(recs).values()) == {200}
    why = extreme_ranks(recs)
    assert list(why)[0] == 200 and why[200] == ["slowest", "straggler"]
    assert why[17] == ["fastest"] and list(why)[-1] == 17
    assert len(why) == 2 * EXTREMES
    fig = timeline_figure(recs)
    lanes = list(fig.layout.yaxis.categoryarray)
    assert lanes[0] == "rank 200 (slowest, straggler)" and lanes[-2] == "rank 17 (fastest)"
    assert len(lanes) == 2 * len(why)  # a phase and a comm lane per drawn rank, not 512
    drawn = {y for t in fig.data for y in t.y}
    assert drawn <= set(lanes)
    assert "straggler: rank 200 in 3/3 steps" in fig.layout.title.text
    assert f"{len(why)} of 256 ranks drawn" in fig.layout.title.text
    # asked for every rank: every rank
    assert len(timeline_figure(recs, every_rank=True).layout.yaxis.categoryarray) == 512


def test_few_ranks_keep_a_lane_each():
    fig = timeline_figure(timeline_records(4, 2, slow=1, fast=2))
    assert list(fig.layout.yaxis.categoryarray)[:2] == ["rank 0", "rank 0 comm"]
    assert "drawn" not in fig.layout.title.text


# ---------------------------------------------------------------- the layout
def test_ddp_replicas_are_one_column_that_says_they_hold_the_whole_model():
    groups = rank_groups(layouts("ddp", 32))
    assert [g["summary"] for g in groups] == ["ranks 0-31 hold the whole model (32 replicas)"]
    fig = layout_figure(layouts("ddp", 32))
    assert list(fig.data[0].x) == ["ranks 0-31"]
    assert "ranks 0-31 hold the whole model (32 replicas)" in fig.layout.title.text


@pytest.mark.parametrize(
    "replicate, summary",
    [
        (1, "ranks 0-1023 hold 1/1024 of every tensor, each a different shard"),
        (4, "ranks 0-1023 hold 1/256 of every tensor: 256 different shards, each on 4 ranks"),
    ],
)
def test_fsdp_shards_of_1024_ranks_are_grouped(replicate, summary):
    lays = layouts("fsdp", 1024, replicate)
    groups = rank_groups(lays)
    assert len(groups) == 1 and groups[0]["summary"] == summary
    fig = layout_figure(lays)
    assert list(fig.data[0].x) == ["ranks 0-1023"] and len(fig.data[0].z) == 3


def test_the_block_view_names_the_ranks_of_a_block_compactly():
    lays = layouts("fsdp", 32, replicate=2)
    labels = [a.text for a in tensor_figure(lays, "layers.0.weight").layout.annotations]
    assert labels[:2] == ["ranks 0,16", "ranks 1,17"]
    lays = layouts("ddp", 32)
    assert [a.text for a in tensor_figure(lays, "layers.0.weight").layout.annotations] == ["ranks 0-31"]


def test_a_mix_of_holdings_gives_a_column_per_group_and_small_sets_a_column_per_rank():
    lays = layouts("ddp", 24)
    for lay in lays[16:]:  # ranks 16-23 hold half of every tensor (rows 0-2047): the same half
        lay["params"] = [layout_param(p["name"], [[0, LAYOUT_ROWS // 2]], ["Shard(0)"]) for p in lay["params"]]
    groups = rank_groups(lays)
    assert [g["summary"] for g in groups] == [
        "ranks 0-15 hold the whole model (16 replicas)",
        "ranks 16-23 hold the same blocks, 1/2 of every tensor (8 replicas)",
    ]
    assert list(layout_figure(lays).data[0].x) == ["ranks 0-15", "ranks 16-23"]
    assert list(layout_figure(layouts("ddp", 4)).data[0].x) == ["rank 0", "rank 1", "rank 2", "rank 3"]


def test_the_dashboards_timeline_panel_says_which_ranks_it_drew(monkeypatch):
    # the ranks' records of 256 SIMULATED ranks stand in for the pull from real ranks
    from workbench.notebook.dashboard import timelines
    from workbench.notebook.dashboard.timeline_panel import TimelinePanel

    recs = timeline_records(256, 3, slow=200, fast=17)
    monkeypatch.setattr(timelines, "records", lambda steps, rankset=None: recs)
    panel = TimelinePanel(lambda: None)
    assert panel.refresh()
    assert f"768 rank-steps pulled, {2 * EXTREMES} ranks drawn (of 256 ranks" in panel.message.value
    assert list(panel.figure.layout.yaxis.categoryarray)[0] == "rank 200 (slowest, straggler)"
