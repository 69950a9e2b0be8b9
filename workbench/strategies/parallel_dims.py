"""Parallelism as independent degrees (torchtitan's ``ParallelDims``, Accelerate's
``ParallelismConfig`` names): ``dp_replicate x dp_shard x cp x tp x pp = world_size``.

Pure logic (no torch): the notebook checks a layout here before any rank changes. One
degree may be ``-1``, "the rest of the world". ``ep`` (expert parallel) borrows ranks
from ``dp_shard x cp`` as in torchtitan, so it is not part of the product.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["ParallelDims", "DEGREES", "MESH_ORDER", "DimsError"]

DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")
# Mesh dimension order, outermost first: pipeline stages talk least, tensor parallel most.
MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


class DimsError(ValueError):
    """Degrees that do not fit the world; the message says what would."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass(frozen=True)
class ParallelDims:
    """Resolved degrees (every one explicit) for ``world_size`` ranks."""

    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int
    ep: int
    world_size: int

    @classmethod
    def build(
        cls,
        world_size: int,
        *,
        dp_replicate: int = 1,
        dp_shard: int = -1,
        cp: int = 1,
        tp: int = 1,
        pp: int = 1,
        ep: int = 1,
    ) -> ParallelDims:
        """Resolve the one ``-1`` degree to what the others leave; raise :class:`DimsError`
        naming sizes that fit when the product is not ``world_size``."""
        given = dict(dp_replicate=dp_replicate, dp_shard=dp_shard, cp=cp, tp=tp, pp=pp)
        for name, v in {**given, "ep": ep}.items():
            if not isinstance(v, int) or isinstance(v, bool) or (v < 1 and v != -1):
                raise DimsError(f"{name}={v!r} must be a positive integer, or -1 for the rest of the world")
        fill = [n for n, v in given.items() if v == -1]
        if len(fill) > 1:
            raise DimsError(
                f"only one degree may be -1 (the rest of the world), got {', '.join(f'{n}=-1' for n in fill)}; "
                f"give all but one as numbers"
            )
        fixed = {n: v for n, v in given.items() if v != -1}
        prod = math.prod(fixed.values())
        if fill:
            name = fill[0]
            if world_size % prod:
                big = [n for n, v in fixed.items() if v > 1]
                what = " x ".join(f"{n}={fixed[n]}" for n in big)
                raise DimsError(f"{what} does not divide world_size={world_size}; {_suggest(world_size, big, name)}")
            given[name] = world_size // prod
        elif prod != world_size:
            big = [n for n, v in fixed.items() if v > 1] or ["dp_shard"]
            what = " x ".join(f"{n}={fixed[n]}" for n in big)
            rest = "dp_shard" if "dp_shard" not in big else None
            raise DimsError(
                f"{what} = {prod} ranks, but the world has {world_size}; "
                f"{_suggest(world_size, big[:1], rest or big[-1])}"
            )
        dims = cls(world_size=world_size, ep=ep, **given)
        if ep > 1 and (dims.dp_shard * dims.cp) % ep:
            raise DimsError(
                f"ep={ep} must divide dp_shard x cp = {dims.dp_shard * dims.cp} "
                f"(experts are spread over the data-parallel shards)"
            )
        return dims

    # ------------------------------------------------------------------ *_enabled views
    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard > 1

    @property
    def cp_enabled(self) -> bool:
        return self.cp > 1

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def ep_enabled(self) -> bool:
        return self.ep > 1

    @property
    def dp_enabled(self) -> bool:
        return self.dp_replicate > 1 or self.dp_shard > 1

    @property
    def fsdp_enabled(self) -> bool:
        """Parameters sharded (FSDP2 / HSDP): over ``dp_shard`` (and ``cp``, which shares weights)."""
        return self.dp_shard > 1 or self.cp > 1

    @property
    def dp_size(self) -> int:
        """Ranks that see different data."""
        return self.dp_replicate * self.dp_shard

    def as_dict(self) -> dict[str, int]:
        return {n: getattr(self, n) for n in DEGREES}

    def mesh_dims(self, always: tuple[str, ...] = ()) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """``(shape, names)`` of the enabled dimensions in :data:`MESH_ORDER` (plus ``always``,
        even at size 1, so a 1-rank world still has a named mesh)."""
        names = tuple(n for n in MESH_ORDER if getattr(self, n) > 1 or n in always)
        shape = tuple(getattr(self, n) for n in names)
        if self.ep > 1:  # ep borrows dp_shard: dp_shard_mod_ep x ep, row-major
            if self.cp > 1 or "dp_shard" not in names:
                raise DimsError(f"ep={self.ep} is laid out over dp_shard alone here; use cp=1 and dp_shard >= ep")
            i = names.index("dp_shard")
            names = names[:i] + ("dp_shard_mod_ep", "ep") + names[i + 1 :]
            shape = shape[:i] + (self.dp_shard // self.ep, self.ep) + shape[i + 1 :]
        return shape, names

    def describe(self) -> str:
        on = [f"{n}={getattr(self, n)}" for n in DEGREES if getattr(self, n) > 1]
        return " x ".join(on) or "1 rank"


def _suggest(world: int, names: list[str], rest: str) -> str:
    """``use one of [...] for tp; sizes that fit: tp=1 x dp_shard=4, ...``."""
    name = names[0] if names else "tp"
    if name == rest:
        return f"use {name}={world}"
    divs = _divisors(world)
    fits = ", ".join(f"{name}={d} x {rest}={world // d}" for d in divs)
    return f"use one of {divs} for {name}; sizes that fit: {fits}"
