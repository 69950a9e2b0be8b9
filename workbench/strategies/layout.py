"""The LAYOUT DESCRIPTION: a plain, JSON-able dict saying where every parameter lives.

Schema (version 1)::

    {"version": 1, "strategy": kind, "path": "native" | "accelerate" | "deepspeed",
     "mesh": {"shape": [...], "dim_names": [...]}, "rank": r, "world_size": w,
     "params": [{"name", "global_shape", "local_shape", "placements": [str], "dtype",
                 "local_bytes", "global_bytes"}],
     "param_bytes_local": int, "param_bytes_global": int, "notes": [str],
     "data": {"dp_rank": int, "dp_size": int}}

``placements`` has one entry per mesh dimension (DTensor's ``Shard(0)``/``Replicate()``;
``Stage(k)`` for a pipeline stage; ``ZeroShard(flat)`` for DeepSpeed ZeRO-3 partitions).
``param_bytes_global`` is the whole model's parameter bytes, the same on every rank.
"""
from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["LAYOUT_VERSION", "describe_params", "make_layout", "dtype_name", "placement_name"]

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
    }


def describe_params(model: nn.Module, mesh_ndim: int, default_placement: str = "Replicate()") -> list[dict]:
    return [_param_entry(n, p, mesh_ndim, default_placement) for n, p in model.named_parameters()]


def make_layout(*, strategy: str, path: str, mesh_shape, dim_names, rank: int, world_size: int,
                params: list[dict], notes: list[str], dp_rank: int, dp_size: int,
                param_bytes_global: int | None = None) -> dict:
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
