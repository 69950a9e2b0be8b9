"""JAX arrays in the layout description that DTensors are drawn from (one picture language).

``engine.describe_jax(params)`` turns a pytree of global ``jax.Array``s into the same
per-rank dict :mod:`workbench.strategies.layout` makes for a torch model, so the layout
figures draw it unchanged. What a rank holds is read from ``array.addressable_shards``,
never re-derived from the spec. torch is never imported here."""

from __future__ import annotations

import math

LAYOUT_VERSION = 1  # workbench.strategies.layout's schema


def _runs(slices: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """A shard's index (one slice per dim) as ``(start, stop)`` per dim."""
    out = []
    for sl, size in zip(slices, shape):
        start, stop, step = sl.indices(size)
        if step != 1:
            raise ValueError(f"a shard index with step {step} (index {slices}): only contiguous shards are drawn")
        out.append((start, stop))
    return tuple(out)


def holdings(array) -> dict:
    """Which global elements this process's shards of ``array`` cover (``holds`` of the schema).

    One local device: its shard. Several: their union, which must be a product of index
    runs (a rectangle per dim) for the grid form; anything else is refused, not guessed."""
    shape = tuple(array.shape)
    distinct = sorted({_runs(s.index, shape) for s in array.addressable_shards})
    if not distinct:
        return {"kind": "grid", "runs": [[] for _ in shape], "partial": False}
    per_dim = []
    for d in range(len(shape)):
        merged: list[list[int]] = []
        for a, b in sorted({idx[d] for idx in distinct}):
            if merged and merged[-1][1] >= a:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        per_dim.append(merged)
    covered = math.prod(sum(b - a for a, b in runs) for runs in per_dim)
    held = sum(math.prod(b - a for a, b in idx) for idx in distinct)
    if covered != held:
        raise ValueError(
            f"this process's {len(distinct)} shards of an array of shape {shape} are not one block per dim "
            f"({distinct}): describe one device per process (the workbench's JAX ranks have one each)"
        )
    return {"kind": "grid", "runs": per_dim, "partial": False}


def placements(sharding, ndim: int) -> tuple[list[int], list[str], list[str]]:
    """(mesh shape, mesh axis names, one placement per axis) of a ``NamedSharding``; any other
    sharding is drawn on a flat ``devices`` axis, sharded where its shards are smaller."""
    mesh = getattr(sharding, "mesh", None)
    spec = getattr(sharding, "spec", None)
    if mesh is None or spec is None:
        count = len(sharding.device_set)
        return [count], ["devices"], ["Replicate()" if sharding.is_fully_replicated else "Sharded(devices)"]
    names = [str(n) for n in mesh.axis_names]
    on: dict[str, str] = {}
    for dim, entry in enumerate(tuple(spec)[:ndim]):
        axes = entry if isinstance(entry, tuple) else (entry,)
        for axis in axes:
            if axis is not None:
                on[str(axis)] = f"Shard({dim})"
    return [int(mesh.shape[n]) for n in mesh.axis_names], names, [on.get(n, "Replicate()") for n in names]


def param_entry(name: str, array) -> dict:
    """One tensor of the description; bytes are what this process's devices really hold."""
    mesh_shape, dim_names, placed = placements(array.sharding, array.ndim)
    holds = holdings(array)
    local_shape = [sum(b - a for a, b in runs) for runs in holds["runs"]]
    itemsize = array.dtype.itemsize
    return {
        "name": name,
        "global_shape": [int(s) for s in array.shape],
        "local_shape": local_shape,
        "placements": placed,
        "dtype": str(array.dtype),
        "local_bytes": int(sum(s.data.nbytes for s in array.addressable_shards)),
        "global_bytes": int(math.prod(array.shape)) * itemsize,
        "holds": holds,
        "_mesh": (mesh_shape, dim_names),
    }


def describe(params, *, strategy: str = "jax", rank: int, world_size: int, notes: tuple[str, ...] = ()) -> dict:
    """The layout description of a pytree of global arrays on this process (rank ``rank``).

    Names are the pytree paths joined by dots (``layers.0.wq``); the mesh is that of the
    largest array (every array of one model shares it in practice)."""
    import jax

    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    entries = [
        param_entry(jax.tree_util.keystr(path, simple=True, separator="."), leaf)
        for path, leaf in leaves
        if isinstance(leaf, jax.Array)
    ]
    if not entries:
        raise ValueError("describe_jax needs a pytree holding jax.Arrays (a dict of parameters, say); it held none")
    largest = max(entries, key=lambda e: e["global_bytes"])
    mesh_shape, dim_names = largest["_mesh"]
    for e in entries:
        shape, names = e.pop("_mesh")
        if names != dim_names:  # another mesh: its placements read per name on the main mesh
            by = dict(zip(names, e["placements"]))
            e["placements"] = [by.get(n, "Replicate()") for n in dim_names]
    return {
        "version": LAYOUT_VERSION,
        "strategy": strategy,
        "path": "jax",
        "mesh": {"shape": mesh_shape, "dim_names": dim_names},
        "rank": int(rank),
        "world_size": int(world_size),
        "params": entries,
        "param_bytes_local": int(sum(e["local_bytes"] for e in entries)),
        "param_bytes_global": int(sum(e["global_bytes"] for e in entries)),
        "notes": list(notes),
        "data": {"dp_rank": int(rank), "dp_size": int(world_size)},
    }
