"""Device meshes for the strategies, built over the EXISTING default process group."""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .base import Context

__all__ = ["make_mesh", "dp_coords"]

# (default group, device, shape, names) -> mesh: one mesh per layout for the life of the
# process group, so that preparing the same layout again (a re-run training cell, the next
# strategy on the same degrees) reuses its sub-groups; each new gloo group would start a
# thread that wakes a hundred times a second for as long as the ranks live
_MESHES: dict[tuple, DeviceMesh] = {}


def make_mesh(ctx: Context, shape, names) -> DeviceMesh:
    """``init_device_mesh(mesh_device, shape, mesh_dim_names=names)``, built once per layout.

    Never initialises or destroys the default group; sub-groups for 2-D meshes are
    created by torch (collectively, on every rank: every rank prepares the same layout)
    and left alive with the mesh, which is kept for the next prepare of that layout.
    """
    world = dist.distributed_c10d._get_default_group()
    for key in [k for k in _MESHES if k[0] is not world]:  # a new process group: old meshes are void
        del _MESHES[key]
    key = (world, ctx.mesh_device, tuple(int(s) for s in shape), tuple(names))
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(key[1], key[2], mesh_dim_names=key[3])
    return _MESHES[key]


def dp_coords(mesh: DeviceMesh, dims) -> tuple[int, int]:
    """This rank's index and the size of the data-parallel part of ``mesh`` (dims in
    row-major order, e.g. ``("dp_replicate", "dp_shard")``)."""
    rank, size = 0, 1
    for d in dims:
        if d in (mesh.mesh_dim_names or ()):
            n = mesh.size(mesh.mesh_dim_names.index(d))
            rank = rank * n + mesh.get_local_rank(d)
            size *= n
    return rank, size
