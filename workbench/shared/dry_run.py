"""What the notebook asks of a dry run and what comes back: plain data both sides import.

The notebook (:mod:`workbench.notebook.dry_run`) sends a :class:`DryRunRequest` to the dry
run's preloaded parent (:mod:`workbench.engine.dry_run.server`), which answers with a
:class:`DryRunResult`: one :class:`Position` per distinct rank position (the ranks it
stands for, the bytes its rank holds, the peak of one step, the collectives it issued).
Pure: no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["DryRunRequest", "Position", "DryRunResult", "DryRunError"]

from .errors import WorkbenchError


class DryRunError(WorkbenchError):
    """The layout cannot be laid out (the strategy's own one-line message), or a position failed."""


@dataclass(frozen=True, kw_only=True)
class DryRunRequest:
    """``build``: a function returning the model (an ``nn.Module`` or a transformers config),
    a transformers config, or a planner catalogue name (``"70b"``). ``spec``: the
    ``StrategySpec`` text the ranks would be prepared with. ``batch``: sequences per
    data-parallel rank in one step (with ``pp``, the micro-batches' worth). ``every_rank``:
    build every rank, not one per position (checks the grouping; small worlds)."""

    build: Any
    world: int
    spec: str
    batch: int
    seq: int
    optimizer: Any = None  # a factory params -> optimizer; None: AdamW
    blocks: Any = None
    tp_plan: dict | None = None
    pp_boundaries: tuple[int, ...] | None = None
    every_rank: bool = False


@dataclass(frozen=True, kw_only=True)
class Position:
    """One distinct rank position, measured on ``rank`` (its representative).

    Bytes are storage bytes on that rank, each storage counted once (FSDP2's padding
    included), as :mod:`workbench.engine.memory_census` counts a live rank. ``peak_bytes``:
    the most bytes alive at once during one training step (``start_bytes`` held when it
    began: parameters, optimizer state, the batch; ``peak_start_bytes`` of those still alive
    at the peak; ``peak_parts``: the bytes alive at the peak by the op that made them). ``modules``: parameter bytes by parameter name with block numbers folded
    (``model.layers.*.mlp.up_proj.weight``). ``collectives``: ``{"op", "ranks", "count",
    "bytes"}`` per op and group."""

    position: int
    rank: int
    ranks: tuple[int, ...]
    stage: int
    coords: dict[str, int]
    blocks: tuple[str, ...]
    param_bytes: int
    grad_bytes: int
    optim_bytes: int
    activation_bytes: int
    peak_bytes: int
    start_bytes: int
    peak_start_bytes: int
    modules: dict[str, int]
    collectives: tuple[dict, ...]
    peak_parts: dict[str, int]
    seconds: dict[str, float]
    notes: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, d: dict) -> Position:
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown Position field(s) {sorted(unknown)}")
        d = dict(d)
        for k in ("ranks", "blocks", "collectives", "notes"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class DryRunResult:
    """The whole dry run: the resolved layout (``spec``, ``mesh``), the model's shape for
    the planner (``shape``: ModelSpec fields, or None) and the facts of its layout the
    planner needs (``facts``), the positions, and how long it took."""

    world: int
    spec: dict
    mesh: dict
    shape: dict | None
    positions: tuple[Position, ...]
    seconds: dict[str, float]
    facts: dict = field(default_factory=dict)  # what the planner must know: see planner.side_by_side
    processes: int = 0  # position processes forked
    checked: dict = field(default_factory=dict)  # every_rank: {"ranks": n, "differ": [...]}

    @classmethod
    def from_dict(cls, d: dict) -> DryRunResult:
        d = dict(d)
        d["positions"] = tuple(Position.from_dict(p) for p in d["positions"])
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)
