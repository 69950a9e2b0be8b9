"""Tier 2: the REAL controller's broadcast tree for 512 SIMULATED ranks (tests/sim_engines.py).

A SIMULATION of the ranks only: 512 stand-in engines in one process register with the real
ipyparallel controller (started as a rank set starts it, the tree's depth chosen for 512) and
answer as ranks do; the controller, its schedulers and the reply merging they do on the way
up are the real ones. One set for the module: 37-90 s on this 2-core machine under other
engineers' load (load average 12-17), most of it the 512 registrations.
"""

from __future__ import annotations

import glob
import json
import os
import re

import pytest
import sim_engines

from workbench.notebook.cluster import launchers
from workbench.notebook.cluster.cell import run_cell
from workbench.notebook.cluster.controller_process import COALESCED
from workbench.shared import replies

N = 512


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    with sim_engines.standin_rankset(N, str(tmp_path_factory.mktemp("standins"))) as rs:
        yield rs
    assert sim_engines.left_behind(rs) == []  # no stand-in, controller or scheduler outlives the set


def test_the_tree_chosen_for_512_ranks_is_the_controllers(standins):
    depth = launchers.broadcast_depth(N)
    assert depth == 2  # four leaves of 128 ranks (two of 256 with ipyparallel's default)
    profile = standins.cluster.profile_dir
    (engine_file,) = glob.glob(
        os.path.join(profile, "security", f"ipcontroller-{standins.cluster.cluster_id}-engine.json")
    )
    with open(engine_file) as f:
        leaves = json.load(f)["broadcast"]  # what the controller serves, one port a leaf
    assert len(leaves) == 2**depth
    # the controller and its processes: the 2**(depth+1) - 1 schedulers of the tree among them
    assert len(sim_engines.controller_tree(standins)) >= 2 ** (depth + 1)


def test_a_cell_on_512_ranks_comes_back_as_one_merged_reply(standins, capsys):
    call = run_cell(standins, "pass")
    assert call.fanned is not None
    assert call.result(timeout=60) == [replies.CellRun(published=0)] * N
    ar = call.fanned.ar
    assert len(ar.msg_ids) == 1  # one request sent, one reply taken in
    flat = ar.get()
    head, distinct = flat[0], flat[1:]
    assert head[COALESCED] == 1 and head["index"] == [0] * N  # 512 quiet ranks: one distinct reply
    assert len(distinct) == 1
    assert sorted(ar._metadata[0]["engine_id"]) == standins.engine_ids  # every rank, through every leaf
    assert capsys.readouterr().out == ""


def test_grouped_output_and_rank_order_through_the_tree(standins, capsys):
    # shown once all is in (no live lines of the first ranks to answer): each distinct output once
    code = "print('low' if rank < world_size // 2 else 'high')\nif rank == 301: print('odd one')"
    run_cell(standins, code, stream=False)
    assert plain(capsys.readouterr().out).splitlines() == [
        "[ranks 0-255] low",
        "[ranks 256-300,302-511] high",
        "[rank 301] high",
        "[rank 301] odd one",
    ]
    assert standins.pull("rank") == list(range(N))  # results in rank order, whichever leaf a rank is on
    standins.push({"x": 7})
    assert standins.pull("x") == [7] * N
