"""The 3-D layout picture (``pp=2 x dp_shard=2 x tp=2`` on 8 real gloo ranks) draws what
each rank holds, by value: every parameter of a tiny GPT filled with distinct values,
each rank's ``to_local()`` compared with the blocks the picture draws for it (the same
check as tests/test_layout_truth.py for 2 and 4 ranks), and the drawn rectangles of a
stage-0 and a stage-1 weight: the pipeline stage picks the four ranks, and inside a stage
FSDP2 x TP puts rank 1 (of the stage) on rows 16-23, as ``_StridedShard`` does.

Eight fresh processes (the shared rank sets have 2 and 4), forked by ``gloo_harness``'s
fork server, which imported torch once for the session; marked slow. A fake process group
(``torch.testing._internal.distributed.fake_pg``) is not a substitute: under it the
sub-groups' ranks differ from the mesh coordinates, and the holds it gives disagree with
the real ranks' (rank 1 of a stage drawn on rows 0-7).
"""

from __future__ import annotations

import pytest
from gloo_harness import run_ranks
from test_layout_truth import WEIGHT, _check, _drawn

from workbench.notebook.dashboard.layout_figure import layout_table, tensor_figure

pytestmark = pytest.mark.slow
SPEC = "pp=2 dp_shard=2 tp=2"


def _held(rank, world, spec):
    from test_layout_truth import held_values_on_rank

    return held_values_on_rank(spec)


def test_3d_picture_draws_the_values_each_rank_holds():
    results = run_ranks(_held, 8, args=(SPEC,), timeout=900)
    layouts, values = [r[0] for r in results], [r[1] for r in results]
    assert layouts[0]["mesh"] == {"shape": [2, 2, 2], "dim_names": ["pp", "dp_shard", "tp"]}
    _check(layouts, values, SPEC)
    cols = (0, 32)
    assert _drawn(tensor_figure(layouts, WEIGHT)) == {
        0: [((0, 8), cols)],
        1: [((16, 24), cols)],
        2: [((8, 16), cols)],
        3: [((24, 32), cols)],
    }
    assert _drawn(tensor_figure(layouts, "layers.2.attention.wq.weight")) == {
        4: [((0, 8), cols)],
        5: [((16, 24), cols)],
        6: [((8, 16), cols)],
        7: [((24, 32), cols)],
    }
    table = layout_table(layouts)
    for name, ranks in ((WEIGHT, [0, 1, 2, 3]), ("layers.2.attention.wq.weight", [4, 5, 6, 7])):
        rows = table[table["tensor"] == name]
        assert sorted(rows["rank"]) == ranks and (rows["fraction"] == 0.25).all()
