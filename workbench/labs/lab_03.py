"""Checks of lab 03 (tensor parallelism), against the layouts the ranks reported."""
from __future__ import annotations

import re

from .checking import CheckFailed, checker

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
            f"(size {p['global_shape'][dim]} split over {n} ranks)")
    return f"w2 is Shard({dim}): row-parallel splits the input features of [out, in]"


@checker("lab_03.w2_local_shape")
def w2_local_shape(value, *, layouts: list[dict], tensor: str = W2) -> str:
    """What shape of feed_forward.w2.weight does each rank hold?"""
    p, n = _param(layouts, tensor)
    want, full = tuple(p["local_shape"]), tuple(p["global_shape"])
    try:
        got = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise CheckFailed(f"answer with a shape tuple like {tuple('?' * len(want))}, got {value!r}") from None
    if got == want:
        return f"w2 is {want} on each of the {n} ranks (global {full})"
    if len(got) != len(want):
        raise CheckFailed(f"{tensor} is {len(want)}-D; your shape {got} has {len(got)} dims")
    if got == full:
        raise CheckFailed(f"{got} is the whole (global) weight: each of the {n} ranks holds 1/{n} of the sharded dim")
    if got == tuple(reversed(want)):
        raise CheckFailed(f"{got} is transposed: nn.Linear stores its weight as [out_features, in_features]")
    split = [d for d in range(len(want)) if want[d] != full[d]]
    wrong = [d for d in range(len(got)) if got[d] != full[d]]
    if wrong and split and wrong != split and all(got[d] * n == full[d] for d in wrong):
        raise CheckFailed(f"you divided dim {wrong[0]} by {n}; the sharded dim is {split[0]} "
                          f"(row-parallel splits the input features)")
    for d in split:
        if got[d] * n * n == full[d] or got[d] == full[d] * n:
            raise CheckFailed(f"dim {d} is {got[d]}: off by a factor of the world size {n}; "
                              f"it is {full[d]} split over {n} ranks")
    raise CheckFailed(f"{got} is not what the ranks hold; the global shape is {full}, sharded over {n} ranks "
                      f"along dim {split[0] if split else '?'}")
