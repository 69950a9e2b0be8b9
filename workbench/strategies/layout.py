"""The layout description: a plain, JSON-able dict saying where every parameter lives.

One schema (:func:`make_layout`) for every strategy, and for JAX arrays too, so the
notebook's layout pictures and the planner's comparisons read any layout alike, asked of the
tensors themselves rather than re-derived from placement names."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["LAYOUT_VERSION", "describe_params", "holdings", "index_runs", "make_layout", "dtype_name", "placement_name"]

LAYOUT_VERSION = 1


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def placement_name(pl) -> str:
    """Stable names across torch versions: ``Shard(0)``, ``Replicate()``, ``Partial(sum)``,
    ``StridedShard(0,sf=2)`` (``str()`` changed to ``S(0)``/``R`` in recent releases)."""
    kind = type(pl).__name__
    if kind == "_StridedShard":
        return f"StridedShard({pl.dim},sf={pl.split_factor})"
    if hasattr(pl, "dim") and "Shard" in kind:
        return f"Shard({pl.dim})"
    if kind == "Replicate":
        return "Replicate()"
    if kind in ("Partial", "_Partial"):
        return f"Partial({getattr(pl, 'reduce_op', 'sum')})"
    return str(pl)


def index_runs(index) -> list[list[int]]:
    """Sorted-or-not global indices -> ``[[start, stop], ...]`` runs of consecutive ones, in order.
    Computed on the whole index at once: a vocabulary-sized dimension has 10^5 entries."""
    t = torch.as_tensor(index, dtype=torch.long).reshape(-1)
    if t.numel() == 0:
        return []
    cuts = ((t[1:] != t[:-1] + 1).nonzero().reshape(-1) + 1).tolist()
    starts, stops = [0, *cuts], [*cuts, t.numel()]
    values = t.tolist()
    return [[values[a], values[b - 1] + 1] for a, b in zip(starts, stops)]


def _dtensor_indices(p) -> list:
    """Global indices, per tensor dim, that a DTensor's local shard covers on this rank.

    DTensor's own bookkeeping (the per-dim index lists behind
    ``compute_local_shape_and_global_offset``, which keeps only their first element):
    shards are applied mesh dim by mesh dim, and a ``_StridedShard`` picks a strided subset
    of what the earlier dims left, so the indices are composed, not added.
    """
    from torch.distributed.tensor._utils import _get_shard_size_and_offsets
    from torch.distributed.tensor.placement_types import Shard, _StridedShard

    mesh, shape = p.device_mesh, list(p.shape)
    coord = mesh.get_coordinate()
    index = [torch.arange(s) for s in shape]
    sizes = list(shape)
    for mesh_dim, pl in enumerate(p.placements):
        if not isinstance(pl, (Shard, _StridedShard)):
            continue
        size, offsets = _get_shard_size_and_offsets(
            sizes[pl.dim], mesh.size(mesh_dim), coord[mesh_dim], pl, index[pl.dim], shape[pl.dim], False
        )
        sizes[pl.dim] = size
        index[pl.dim] = offsets[:size] if size else torch.arange(0)
    return index


def holdings(p: torch.Tensor) -> dict:
    """Which global elements this rank's local copy of ``p`` covers, asked of the tensor itself
    rather than re-derived from placement names: ``{"kind": "grid", "runs": [[[start, stop],
    ...] per tensor dim], "partial": bool}`` (the local tensor is the product of those index
    runs, in order; a strided shard has several; ``partial``: a ``Partial`` placement, the
    right shape but a partial sum), or ``{"kind": "flat", "runs": [[start, stop]]}`` for a
    range of the flattened tensor (DeepSpeed ZeRO-3 partitions). Readers that need ``holds``
    (a later addition to version 1) say so when it is missing.

    Checked against the local tensor's real shape: a mismatch raises rather than
    letting a picture show a shard the rank does not hold.
    """
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        index = _dtensor_indices(p)
        local = tuple(p.to_local().shape)
        if tuple(len(i) for i in index) != local:
            raise RuntimeError(
                f"index lists {[len(i) for i in index]} disagree with the local shape {local} "
                f"of a DTensor with placements {p.placements}"
            )
        partial = any(pl.is_partial() for pl in p.placements)
        return {"kind": "grid", "runs": [index_runs(i) for i in index], "partial": partial}
    if hasattr(p, "ds_tensor"):  # DeepSpeed ZeRO-3: rank k of the partition group holds flat slot k
        import torch.distributed as dist

        size = int(p.ds_tensor.ds_numel)
        start = size * dist.get_rank(group=p.ds_process_group)
        stop = min(start + size, int(p.ds_numel))
        return {"kind": "flat", "runs": [[start, stop]] if stop > start else [], "partial": False}
    return {"kind": "grid", "runs": [[[0, s]] for s in p.shape], "partial": False}


def _param_entry(name: str, p: torch.Tensor, mesh_ndim: int, default_placement: str) -> dict:
    from torch.distributed.tensor import DTensor

    if isinstance(p, DTensor):
        local = p.to_local()
        gshape, lshape = list(p.shape), list(local.shape)
        placements = [placement_name(pl) for pl in p.placements]
        # FSDP+TP nest DTensors on a 2-D mesh; pad to the mesh's rank for the reader.
        placements += ["Replicate()"] * (mesh_ndim - len(placements))
        esize = local.element_size()
    elif hasattr(p, "ds_tensor"):  # DeepSpeed ZeRO-3 partitioned parameter
        gshape = list(p.ds_shape)
        lshape = list(p.ds_tensor.shape)
        placements = ["ZeroShard(flat)"] * max(1, mesh_ndim)
        esize = p.ds_tensor.element_size()
        local = p.ds_tensor
    else:
        gshape = lshape = list(p.shape)
        placements = [default_placement] * max(1, mesh_ndim)
        esize = p.element_size()
        local = p
    return {
        "name": name,
        "global_shape": gshape,
        "local_shape": lshape,
        "placements": placements,
        "dtype": dtype_name(local.dtype),
        "local_bytes": int(math.prod(lshape)) * esize,
        "global_bytes": int(math.prod(gshape)) * esize,
        "holds": holdings(p),
    }


FLATTENED = {"dp_shard_cp": ("dp_shard", "cp")}


def describe_params(
    model: nn.Module,
    mesh_ndim: int,
    default_placement: str = "Replicate()",
    dim_names: tuple[str, ...] | None = None,
    flattened: dict[str, tuple[str, ...]] | None = None,
) -> list[dict]:
    """One entry per parameter; with ``dim_names`` (the layout's mesh), placements are
    matched to them by the DTensor mesh's own dim names (a flattened dim counts for each
    of its parts, e.g. ``dp_shard_cp`` for ``dp_shard`` and ``cp``: sharding over the
    flattened dim is the same as ``Shard`` over each in row-major order)."""
    flat = {**FLATTENED, **(flattened or {})}
    out = []
    for n, p in model.named_parameters():
        e = _param_entry(n, p, mesh_ndim, default_placement)
        mesh = getattr(p, "device_mesh", None)
        if dim_names is not None and mesh is not None and mesh.mesh_dim_names:
            by = {}
            for name, pl in zip(mesh.mesh_dim_names, p.placements):
                for part in flat.get(name, (name,)):
                    by[part] = placement_name(pl)
            e["placements"] = [by.get(d, "Replicate()") for d in dim_names]
        out.append(e)
    return out


def make_layout(
    *,
    strategy: str,
    path: str,
    mesh_shape,
    dim_names,
    rank: int,
    world_size: int,
    params: list[dict],
    notes: list[str],
    dp_rank: int,
    dp_size: int,
    param_bytes_global: int | None = None,
) -> dict:
    """The layout description (``LAYOUT_VERSION``)::

        {"version": 1, "strategy": kind, "path": "native" | "accelerate" | "deepspeed",
         "mesh": {"shape": [...], "dim_names": [...]}, "rank": r, "world_size": w,
         "params": [{"name", "global_shape", "local_shape", "placements": [str], "dtype",
                     "local_bytes", "global_bytes", "holds", "compute"?}],
         "param_bytes_local": int, "param_bytes_global": int, "notes": [str],
         "data": {"dp_rank": int, "dp_size": int}}

    ``placements``: one per mesh dimension (``Shard(0)``/``Replicate()``; ``Stage(k)`` for a
    pipeline stage; ``ZeroShard(flat)`` for ZeRO-3 partitions); ``holds``: :func:`holdings`;
    ``compute``: ``"fp8 tensorwise"`` / ``"fp8 rowwise"`` (``" (emulated)"``) where the
    weight's matmuls run in fp8. ``param_bytes_global`` is the same on every rank.
    """
    local = sum(p["local_bytes"] for p in params)
    glob = sum(p["global_bytes"] for p in params) if param_bytes_global is None else param_bytes_global
    return {
        "version": LAYOUT_VERSION,
        "strategy": strategy,
        "path": path,
        "mesh": {"shape": [int(s) for s in mesh_shape], "dim_names": list(dim_names)},
        "rank": int(rank),
        "world_size": int(world_size),
        "params": params,
        "param_bytes_local": int(local),
        "param_bytes_global": int(glob),
        "notes": list(notes),
        "data": {"dp_rank": int(dp_rank), "dp_size": int(dp_size)},
    }


def flat_layout(ctx, *, strategy: str, path: str, module: nn.Module, data_parallel: bool = True) -> dict:
    """The layout on one flat mesh of every rank (``dp``), as DDP, DeepSpeed and Accelerate
    lay a model out; ``data_parallel``: each rank trains on its own share of the data
    (else every rank is a data-parallel group of one)."""
    return make_layout(
        strategy=strategy,
        path=path,
        mesh_shape=(ctx.world_size,),
        dim_names=("dp",),
        rank=ctx.rank,
        world_size=ctx.world_size,
        params=describe_params(module, 1),
        notes=ctx.notes,
        dp_rank=ctx.rank if data_parallel else 0,
        dp_size=ctx.world_size if data_parallel else 1,
    )
