"""The layout pictures draw what each rank really holds (values, not shapes).

Every parameter of a tiny GPT is filled with distinct values (its own ``arange`` plus an
offset) before ``prepare``. For every layout on 2 and 4 live gloo ranks, each rank's
local data (``to_local()``, a ZeRO-3 partition, or the plain tensor) must equal, as a
multiset of values, the union of the blocks the picture draws for that rank; and the
blocks of all ranks together must cover every tensor. The figure's own rectangles are
checked against those blocks for one weight per layout, the 2-D FSDP x TP case included
(where ``_StridedShard`` puts rank 1 on rows 16-23 of ``wq``, not 8-15).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from workbench.notebook.dashboard.layout_figure import (
    grid_shape,
    held_blocks,
    layout_table,
    tensor_blocks,
    tensor_figure,
)
from workbench.shared.ranges import parse_ranks

CFG = dict(n_layers=4, n_kv_heads=4)
SPECS = ["ddp", "fsdp2", "fsdp2 replicate=2", "zero stage=1", "zero stage=2", "zero3", "tp", "fsdp2_tp tp=2", "pp"]
WEIGHT = "layers.0.attention.wq.weight"


# ------------------------------------------------------------------ rank side
def held_values_on_rank(spec_text: str):
    """Fill every parameter with distinct values, prepare, return (layout, {name: (offset, local values)})."""
    import torch
    from torch.distributed.tensor import DTensor

    from workbench.models import GPT, GPTConfig
    from workbench.strategies import prepare, reset_accelerate_state

    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny(**CFG))
    offsets, offset = {}, 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape) + offset)
            offsets[name] = offset
            offset += p.numel()
    assert offset < 2**24  # exact in float32
    prepared = prepare(model, lambda ps: torch.optim.SGD(ps, lr=0.0), spec_text)
    try:
        values = {}
        for name, p in prepared.unwrap().named_parameters():
            if isinstance(p, DTensor):
                local = p.to_local()
            elif hasattr(p, "ds_tensor"):
                entry = next(e for e in prepared.layout["params"] if e["name"] == name)
                runs = entry["holds"]["runs"]
                local = p.ds_tensor[: sum(b - a for a, b in runs)]  # the tail past the tensor is padding
            else:
                local = p
            values[name] = (offsets[name], local.detach().float().reshape(-1).numpy().copy())
        return prepared.layout, values
    finally:
        prepared.close()
        reset_accelerate_state()


# ------------------------------------------------------------------ notebook side
def _full(offset: int, shape) -> np.ndarray:
    rows, cols = grid_shape(list(shape))
    return (np.arange(rows * cols, dtype=np.float64) + offset).reshape(rows, cols)


def _drawn(fig) -> dict[int, list[tuple]]:
    """{rank: [((row0, row1), (col0, col1))]} read back from the figure's rectangles and labels."""
    out: dict[int, list[tuple]] = {}
    for shape, ann in zip(fig.layout.shapes, fig.layout.annotations):
        ranks = parse_ranks(re.match(r"ranks? ([\d,-]+)", ann.text).group(1), 1 << 20)  # "ranks 0-3,6"
        rect = ((int(shape.y0), int(shape.y1)), (int(shape.x0), int(shape.x1)))
        for r in ranks:
            out.setdefault(r, []).append(rect)
    return out


def _check(layouts, values_per_rank, spec):
    names = list(dict.fromkeys(p["name"] for lay in layouts for p in lay["params"]))
    for name in names:
        shape, _, blocks = tensor_blocks(layouts, name)
        covered = np.zeros(grid_shape(shape), dtype=bool)
        for lay, values in zip(layouts, values_per_rank):
            if name not in values:
                continue
            offset, local = values[name]
            full = _full(offset, shape)
            entry = next(p for p in lay["params"] if p["name"] == name)
            drawn = [rect for rect, ranks in blocks.items() if lay["rank"] in ranks]
            assert sorted(drawn) == sorted(held_blocks(entry))
            want = np.concatenate([full[a:b, c:d].reshape(-1) for (a, b), (c, d) in drawn])
            assert np.array_equal(np.sort(local), np.sort(want)), (
                f"{spec}: rank {lay['rank']} holds other values of {name} than the picture draws (drawn blocks {drawn})"
            )
            for (a, b), (c, d) in drawn:
                covered[a:b, c:d] = True
        assert covered.all(), f"{spec}: parts of {name} drawn on no rank"


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("spec", SPECS)
def test_picture_draws_the_values_each_rank_holds(world, spec, request):
    ranks = request.getfixturevalue(f"ranks{world}")
    results = ranks.apply(held_values_on_rank, spec)
    layouts = [r[0] for r in results]
    values = [r[1] for r in results]
    _check(layouts, values, spec)
    if spec == "pp":
        return  # a stage's tensors appear on one rank: the values check above is the picture
    fig = tensor_figure(layouts, WEIGHT)
    _, _, blocks = tensor_blocks(layouts, WEIGHT)
    want: dict[int, list] = {}
    for rect, rs in blocks.items():
        for r in rs:
            want.setdefault(r, []).append(rect)
    assert {r: sorted(v) for r, v in _drawn(fig).items()} == {r: sorted(v) for r, v in want.items()}
    table = layout_table(layouts)
    row = table[(table["tensor"] == WEIGHT)]
    if spec in ("ddp", "zero stage=1", "zero stage=2") or (spec == "fsdp2 replicate=2" and world == 2):
        assert set(row["holding"]) == {"whole"} and (row["fraction"] == 1).all()
    else:
        assert (row["fraction"] < 1).all() and abs(
            row["fraction"].sum() - (2 if spec == "fsdp2 replicate=2" else 1)
        ) < 1e-12


def test_fsdp2_tp_draws_rank_1_on_rows_16_to_23(ranks4):
    results = ranks4.apply(held_values_on_rank, "fsdp2_tp tp=2")
    layouts = [r[0] for r in results]
    drawn = _drawn(tensor_figure(layouts, WEIGHT))
    cols = (0, 32)
    assert drawn == {0: [((0, 8), cols)], 1: [((16, 24), cols)], 2: [((8, 16), cols)], 3: [((24, 32), cols)]}


def test_flat_partition_is_drawn_as_the_rectangles_it_covers():
    """A ZeRO-3 flat range that starts and ends mid-row is three blocks on the grid."""
    param = {"name": "w", "global_shape": [4, 10], "holds": {"kind": "flat", "runs": [[7, 27]], "partial": False}}
    assert held_blocks(param) == [((0, 1), (7, 10)), ((1, 2), (0, 10)), ((2, 3), (0, 7))]
    strided = {
        "name": "w",
        "global_shape": [8, 3, 2],
        "holds": {"kind": "grid", "runs": [[[0, 2], [4, 6]], [[1, 2]], [[0, 2]]], "partial": False},
    }
    assert held_blocks(strided) == [((0, 2), (2, 4)), ((4, 6), (2, 4))]
    with pytest.raises(ValueError, match="prepare the model again"):
        held_blocks({"name": "w", "global_shape": [2, 2]})
