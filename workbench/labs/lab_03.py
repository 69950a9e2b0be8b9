"""Checks of lab 03 (tensor parallelism), against the layouts the ranks reported."""

from __future__ import annotations

import re

from .checking import CheckFailed, checker
from .hints import fail_if, shape_mismatch

W2 = "layers.0.feed_forward.w2.weight"


def _param(layouts: list[dict], tensor: str) -> tuple[dict, int]:
    """The tensor's entry on rank 0 and the number of ranks that reported a layout."""
    for p in layouts[0]["params"]:
        if p["name"] == tensor:
            return p, len(layouts)
    raise CheckFailed(f"the ranks' layouts hold no tensor {tensor!r}: run the prepare cell with 'tp' first")


def _shard_dim(p: dict) -> int | None:
    for pl in p["placements"]:
        m = re.fullmatch(r"Shard\(dim=(-?\d+)\)|Shard\((-?\d+)\)", pl)
        if m:
            return int(m.group(1) or m.group(2))
    return None


@checker("lab_03.w2_shard_dim")
def w2_shard_dim(value, *, layouts: list[dict], tensor: str = W2) -> str:
    """Which dim of feed_forward.w2.weight ([dim, ffn_dim]) does tensor parallelism split?"""
    p, n = _param(layouts, tensor)
    dim = _shard_dim(p)
    if dim is None:
        raise CheckFailed(f"{tensor} is not sharded in this run ({p['placements']}): prepare the model with 'tp'")
    ndim = len(p["global_shape"])
    if not isinstance(value, int) or isinstance(value, bool):
        raise CheckFailed(f"answer with a dim number (0 or 1 for a 2-D weight), got {value!r}")
    if not -ndim <= value < ndim:
        raise CheckFailed(f"{tensor} has {ndim} dims ({tuple(p['global_shape'])}); dim {value} does not exist")
    if value % ndim != dim:
        raise CheckFailed(
            f"you sharded dim {value % ndim}, the weight's output features: that is column-parallel "
            f"(w1/w3, wq/wk/wv). w2 is row-parallel: it splits its INPUT features, and nn.Linear "
            f"stores its weight as [out, in], so the input features are dim {dim} "
            f"(size {p['global_shape'][dim]} split over {n} ranks)"
        )
    return f"w2 is Shard({dim}): row-parallel splits the input features of [out, in]"


@checker("lab_03.w2_local_shape")
def w2_local_shape(value, *, layouts: list[dict], tensor: str = W2) -> str:
    """What shape of feed_forward.w2.weight does each rank hold?"""
    p, n = _param(layouts, tensor)
    want, full = tuple(p["local_shape"]), tuple(p["global_shape"])
    fail_if(shape_mismatch(value, want, full, n, what="w2's local shape"))
    return f"w2 is {want} on each of the {n} ranks (global {full})"


@checker("lab_03.w1_local_shape")
def w1_local_shape(value, *, local_shapes: list, full_shape) -> str:
    """What shape is W1_local, this rank's slice of the column-parallel W1 ([H, D])?"""
    n = len(local_shapes)
    want = tuple(local_shapes[0])
    if any(tuple(s) != want for s in local_shapes):
        raise CheckFailed(f"the ranks hold different W1 shapes {local_shapes}: rerun the hand-written TP cell")
    fail_if(shape_mismatch(value, want, tuple(full_shape), n, what="W1_local's shape"))
    return f"W1_local is {want} on each of the {n} ranks: column-parallel splits W1's dim 0 (output features)"
