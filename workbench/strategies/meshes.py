"""Device meshes for the strategies, built over the EXISTING default process group."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from .base import Context

__all__ = ["make_mesh", "dp_coords"]


def make_mesh(ctx: Context, shape, names) -> DeviceMesh:
    """``init_device_mesh(mesh_device, shape, mesh_dim_names=names)``.

    Never initialises or destroys the default group; sub-groups for 2-D meshes are
    created by torch (collectively, on every rank) and left alive with the mesh.
    """
    return init_device_mesh(ctx.mesh_device, tuple(int(s) for s in shape), mesh_dim_names=tuple(names))


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
