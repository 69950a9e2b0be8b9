"""Which ranks of a pipeline stage hold shards of the same shapes: one position each.

After ``prepare`` on one rank of a stage, the local shape every other rank of the stage holds
follows from each parameter's global shape, placements and mesh: torch's own
``_compute_local_shape_and_global_offset`` at that rank's coordinate. Which layout dimensions
a parameter's mesh spans (a slice, or ``dp_shard x cp`` flattened) is read from the ranks it
holds, not from its names. See docs/dry-run.md."""

from __future__ import annotations

import math

from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

__all__ = ["coords_of", "stage_ranks", "shape_signatures", "own_local_shapes_agree"]


def coords_of(rank: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major coordinates of ``rank`` in a mesh of ``shape`` (``init_device_mesh``'s order)."""
    out = []
    for size in reversed(shape):
        out.append(rank % size)
        rank //= size
    return tuple(reversed(out))


def stage_ranks(rank: int, shape: tuple[int, ...], names: tuple[str, ...]) -> list[int]:
    """Every rank of ``rank``'s pipeline stage (every rank where the mesh has no ``pp``)."""
    world = math.prod(shape)
    if "pp" not in names:
        return list(range(world))
    i = names.index("pp")
    mine = coords_of(rank, shape)[i]
    return [r for r in range(world) if coords_of(r, shape)[i] == mine]


def _spans(mesh, rank: int, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """For each dimension of ``mesh``: the layout dimensions its ranks vary along."""
    import numpy as np

    grid = np.asarray(mesh.mesh.tolist())
    here = [int(c) for c in np.argwhere(grid == rank)[0]]
    spans = []
    for d in range(grid.ndim):
        at = list(here)
        at[d] = slice(None)
        line = [coords_of(int(r), shape) for r in grid[tuple(at)]]
        spans.append(tuple(k for k in range(len(shape)) if len({c[k] for c in line}) > 1))
    return spans


def _coordinate(root: tuple[int, ...], spans, shape: tuple[int, ...]) -> list[int]:
    """A rank's coordinate in a parameter's mesh: row-major over the layout dims each spans."""
    out = []
    for dims in spans:
        c = 0
        for k in dims:
            c = c * shape[k] + root[k]
        out.append(c)
    return out


def shape_signatures(model: nn.Module, rank: int, ranks: list[int], shape: tuple[int, ...]) -> dict[int, int]:
    """``{rank: class}`` over ``ranks`` (this rank's stage): ranks in one class hold every
    parameter of ``model`` in the same local shape as each other."""
    roots = {r: coords_of(r, shape) for r in ranks}
    spans_of: dict[int, list] = {}
    local: dict[tuple, dict[int, tuple]] = {}
    rows: dict[int, list] = {r: [] for r in ranks}
    for p in model.parameters():
        if not isinstance(p, DTensor):
            continue  # the same tensor on every rank
        mesh = p.device_mesh
        key = (id(mesh), tuple(p.shape), tuple(p.placements))
        if key not in local:
            if id(mesh) not in spans_of:
                spans_of[id(mesh)] = _spans(mesh, rank, shape)
            spans = spans_of[id(mesh)]
            local[key] = {
                r: tuple(
                    _compute_local_shape_and_global_offset(
                        tuple(p.shape), tuple(mesh.shape), _coordinate(roots[r], spans, shape), p.placements, True
                    )[0]
                )
                for r in ranks
            }
        for r in ranks:
            rows[r].append(local[key][r])
    classes: dict[tuple, int] = {}
    return {r: classes.setdefault(tuple(rows[r]), len(classes)) for r in ranks}


def own_local_shapes_agree(model: nn.Module, rank: int, shape: tuple[int, ...]) -> bool:
    """The arithmetic above, applied to this rank itself, gives the shapes it really holds."""
    spans_of: dict[int, list] = {}
    for p in model.parameters():
        if isinstance(p, DTensor):
            key = id(p.device_mesh)
            spans = spans_of[key] = spans_of.get(key) or _spans(p.device_mesh, rank, shape)
            want = _compute_local_shape_and_global_offset(
                tuple(p.shape),
                tuple(p.device_mesh.shape),
                _coordinate(coords_of(rank, shape), spans, shape),
                p.placements,
                True,
            )[0]
            if tuple(want) != tuple(p.to_local().shape):
                return False
    return True
