"""Device meshes and process groups of the layouts prepared on this rank, built over the
existing default process group: built once per layout, destroyed once no model uses them.

Every gloo group keeps a thread that wakes a hundred times a second for as long as it
lives, so a rank that tried several layouts would carry all their groups: preparing the same
layout again (a re-run cell) reuses its groups, and at the end of a prepare the groups of
every layout whose models are all gone are destroyed, on every rank at once."""

from __future__ import annotations

import contextlib
import gc
import weakref
from dataclasses import dataclass, field

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

__all__ = ["make_mesh", "dp_coords", "enter_layout", "layout_scope", "adopt_with", "release_unused", "live_layouts"]


@dataclass
class _Layout:
    world: object  # the default group the groups were made in
    mesh: DeviceMesh | None = None
    groups: list = field(default_factory=list)  # made while preparing models on this layout
    users: dict = field(default_factory=dict)  # id(prepared) -> weakrefs to it and its modules
    on_free: list = field(default_factory=list)  # forget library state holding the groups

    def in_use(self) -> bool:
        return any(r() is not None for refs in self.users.values() for r in refs)


# layout description (picklable, the same on every rank) -> what it holds
_LAYOUTS: dict[tuple, _Layout] = {}
_SCOPES: list[dict] = []  # the prepares in progress on this rank (innermost last)
_ADOPT: list = []  # called with the prepared object of a successful outermost prepare


def _world():
    return c10d._get_default_group()


def _current(key: tuple, world) -> _Layout:
    for k in [k for k, lay in _LAYOUTS.items() if lay.world is not world]:
        del _LAYOUTS[k]  # a new default group: the old one's groups went with it
    lay = _LAYOUTS.get(key)
    if lay is None:
        lay = _LAYOUTS[key] = _Layout(world=world)
    return lay


def enter_layout(key: tuple, on_free=None) -> None:
    """Say which layout the prepare in progress builds (its groups are kept under ``key``);
    ``on_free`` is called after that layout's groups are destroyed."""
    lay = _current(tuple(key), _world())
    if on_free is not None and on_free not in lay.on_free:
        lay.on_free.append(on_free)
    if _SCOPES:
        _SCOPES[-1]["key"] = tuple(key)


@contextlib.contextmanager
def layout_scope(fallback_key: tuple):
    """Around one prepare on every rank: the process groups made inside belong to its layout
    (``fallback_key`` when no mesh or engine named one). Yields a dict; put the prepared
    object under ``"prepared"``. After a successful prepare, other unused layouts are freed."""
    if not (dist.is_available() and dist.is_initialized()):
        yield {}
        return
    scope = {"key": None, "before": set(c10d._world.pg_map), "prepared": None}
    _SCOPES.append(scope)
    try:
        yield scope
    finally:
        _SCOPES.pop()
        key = scope["key"] or tuple(fallback_key)
        made = [g for g in c10d._world.pg_map if g not in scope["before"]]
        if made or key in _LAYOUTS or scope["prepared"] is not None:
            lay = _current(key, _world())
            lay.groups.extend(g for g in made if all(g is not h for h in lay.groups))
            if scope["prepared"] is not None:
                track(scope["prepared"], key)
    if scope["prepared"] is not None:
        if not _SCOPES:
            for fn in _ADOPT:
                fn(scope["prepared"])  # e.g. the rank's current model moves on: the old one may go now
        release_unused(keep=key)


@contextlib.contextmanager
def adopt_with(fn):
    """Inside: ``fn(prepared)`` is called at the end of a successful (outermost) prepare,
    before unused layouts are freed, so that whatever ``fn`` lets go of is freed by this
    prepare's one ``release_unused`` rather than the next."""
    _ADOPT.append(fn)
    try:
        yield
    finally:
        _ADOPT.remove(fn)


def track(prepared, key: tuple) -> None:
    """Count ``prepared`` (its model and the user's module too) as a user of layout ``key``."""
    refs = []
    for obj in (prepared, getattr(prepared, "model", None), getattr(prepared, "_inner", None)):
        if obj is not None:
            with contextlib.suppress(TypeError):
                refs.append(weakref.ref(obj))
    _LAYOUTS[key].users[id(prepared)] = refs
    prepared._layout_key = key


def forget_user(prepared) -> None:
    """``prepared`` was closed: it no longer holds its layout's groups."""
    lay = _LAYOUTS.get(getattr(prepared, "_layout_key", None))
    if lay is not None:
        lay.users.pop(id(prepared), None)


def live_layouts() -> dict[tuple, int]:
    """Layout -> how many process groups it holds, on this rank."""
    return {k: len(lay.groups) for k, lay in _LAYOUTS.items()}


def release_unused(keep: tuple | None = None) -> list[tuple]:
    """Destroy the process groups of every layout no model uses any more (but ``keep``).

    Collective over the default group: a layout is freed only where every rank finds it
    unused, so that the next prepare of it makes its groups anew on every rank alike.
    Returns the layouts freed."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    world = _world()
    others = [k for k, lay in _LAYOUTS.items() if k != keep and lay.world is world]
    if not others:
        return []
    if any(_LAYOUTS[k].in_use() for k in others):
        gc.collect()  # models in reference cycles (hooks, FSDP state) are gone only after this
    unused = sorted(repr(k) for k in others if not _LAYOUTS[k].in_use())
    if dist.get_world_size() > 1:
        every: list = [None] * dist.get_world_size()
        dist.all_gather_object(every, unused)
        agreed = set.intersection(*(set(u) for u in every))
    else:
        agreed = set(unused)
    freed = [k for k in others if repr(k) in agreed]
    if any(_LAYOUTS[k].mesh is not None for k in freed):
        _forget_dtensor_caches()
    for k in freed:
        lay = _LAYOUTS.pop(k)
        lay.mesh = None
        for g in lay.groups:
            if g in c10d._world.pg_map:
                dist.destroy_process_group(g)
        for fn in lay.on_free:
            fn(lay.groups)
        lay.groups.clear()
    if freed:
        gc.collect()  # a mesh and its slices refer to each other: their groups go with the cycle
    return freed


def _forget_dtensor_caches() -> None:
    """DTensor's planning caches are keyed by meshes that compare equal by shape: an entry
    of a freed mesh keeps its groups alive and would hand them to a new mesh of that shape."""
    from torch.distributed.tensor import _collective_utils, _redistribute, _sharding_prop, debug

    debug._clear_sharding_prop_cache()
    _redistribute._planner_cache.clear()
    for cached in (
        _redistribute._gen_transform_infos,
        _collective_utils.MeshTopoInfo.build_from_mesh,
        _sharding_prop.ShardingPropagator._propagate_tensor_meta_cached,
    ):
        cached.cache_clear()


def make_mesh(mesh_device: str, shape, names) -> DeviceMesh:
    """``init_device_mesh(mesh_device, shape, mesh_dim_names=names)``, built once per layout.

    Never initialises or destroys the default group; sub-groups for 2-D meshes are
    created by torch (collectively, on every rank: every rank prepares the same layout)
    and kept with the layout until no model uses it (see the module doc).
    """
    key = ("mesh", mesh_device, tuple(int(s) for s in shape), tuple(names))
    enter_layout(key)
    lay = _LAYOUTS[key]
    if lay.mesh is None:
        before = set(c10d._world.pg_map)
        lay.mesh = init_device_mesh(key[1], key[2], mesh_dim_names=key[3])
        lay.groups.extend(g for g in c10d._world.pg_map if g not in before)
    return lay.mesh


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
