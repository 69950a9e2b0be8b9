"""The replies of :mod:`workbench.engine.rpc`'s requests: frozen dataclasses both sides import.

A rank builds its reply from the rank-side dict (``SaveInfo.from_dict(info)``); the notebook
reads typed fields, and where its public API returns a dict (``ckpt.save()``,
``timelines.records()``) it hands back ``reply.to_dict()``. A key the reply does not know is
refused on the rank, so the two sides cannot drift apart silently. Pure: no torch, no widgets."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from .checkpoint.integrity import Problem

__all__ = [
    "SaveInfo",
    "LoadInfo",
    "LoadReply",
    "Problems",
    "Staged",
    "Version",
    "ExportInfo",
    "ProfileState",
    "Trace",
    "StepRecord",
    "StepRecords",
    "PipelineStageRun",
    "ProbeReport",
    "LayoutReply",
    "CensusReply",
    "Host",
    "Stored",
    "HostEnvironment",
    "SyncPlanned",
    "SyncCheckedOut",
    "Reloaded",
    "SyncEdited",
    "TrainerState",
    "StagedHparams",
    "RunEnded",
    "Size",
    "ReplicaMember",
    "EXIT_REPLICA_LOST",
    "LogExcerpt",
]


class _Reply:
    """``from_dict``/``to_dict`` between a reply and the dict the rank code (and the public
    API) speaks. ``_KEYS`` renames fields whose dict key is a Python keyword (``async``);
    ``_OMIT_NONE`` fields are left out of ``to_dict`` when None (readers test their presence)."""

    _KEYS: ClassVar[dict[str, str]] = {}
    _OMIT_NONE: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_dict(cls, d: dict):
        back = {v: k for k, v in cls._KEYS.items()}
        names = {f.name for f in fields(cls)}
        kwargs = {back.get(k, k): v for k, v in d.items()}
        unknown = sorted(set(kwargs) - names)
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {', '.join(unknown)} (fields: {', '.join(sorted(names))})")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()})

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.name in self._OMIT_NONE:
                continue
            out[self._KEYS.get(f.name, f.name)] = list(v) if isinstance(v, tuple) else v
        return out


# ----------------------------------------------------------------------------- checkpoints
@dataclass(frozen=True, kw_only=True)
class CellRun:
    """One rank's ``%%distrain`` cell: how many messages it published while it ran (0: no
    output is on its way, so the notebook need not wait for the stream; None: unknown)."""

    published: int | None


@dataclass(frozen=True, kw_only=True)
class SaveInfo(_Reply):
    """One rank's save: ``async_`` and no ``save_s`` while a background save still writes;
    ``failed`` says why a background save kept nothing; ``removed`` the auto-saves retention
    deleted (rank 0)."""

    _KEYS: ClassVar[dict[str, str]] = {"async_": "async"}
    _OMIT_NONE: ClassVar[tuple[str, ...]] = ("async_", "save_s", "blocked_s", "failed", "removed", "retention_error")

    name: str
    step: int
    path: str
    async_: bool | None = None
    save_s: float | None = None
    blocked_s: float | None = None
    failed: str | None = None
    removed: tuple[str, ...] | None = None
    retention_error: str | None = None


@dataclass(frozen=True, kw_only=True)
class LoadInfo(_Reply):
    """One rank's load: what was loaded, saved how, into what, and how long it took."""

    name: str
    step: int
    loss: float | None
    path: str
    from_world_size: int
    from_strategy: str
    world_size: int
    strategy: str
    model_only: bool
    load_s: float
    verify_s: float
    staging_bytes: int
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class LoadReply:
    """``info`` when loaded; else ``damaged`` (the same on every rank) and nothing was applied."""

    info: LoadInfo | None = None
    damaged: tuple[Problem, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Problems:
    """What every rank found wrong with a checkpoint's files (empty: it is good)."""

    problems: tuple[Problem, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Staged:
    """Whether this rank's trainer took the staged change (then commit it)."""

    staged: bool


@dataclass(frozen=True, kw_only=True)
class Version:
    """The trainer's next change version (1 where no trainer runs)."""

    version: int


@dataclass(frozen=True, kw_only=True)
class ExportInfo(_Reply):
    """A consolidated export: ``files``, ``architectures`` and ``names`` (``"save_pretrained"``
    where stacked MoE experts were written one expert at a time) for a Hugging Face folder."""

    _OMIT_NONE: ClassVar[tuple[str, ...]] = ("files", "architectures", "names")

    path: str
    tensors: int
    params: int
    bytes: int
    step: int
    files: tuple[str, ...] | None = None
    architectures: tuple[str, ...] | None = None
    names: str | None = None


# ----------------------------------------------------------------------------- profiles, timelines
@dataclass(frozen=True, kw_only=True)
class ProfileState(_Reply):
    """One rank's profiler: armed for ``steps``, ``seen`` so far, ``done`` (trace at ``path``)
    or ``error``; ``trainer_state`` of the trainer it hooks (None without one)."""

    steps: int | None = None
    seen: int = 0
    done: bool = False
    path: str | None = None
    error: str | None = None
    started_step: int | None = None
    profiling: bool = False
    trainer_state: str | None = None


@dataclass(frozen=True, kw_only=True)
class Trace:
    """A rank's Chrome/Perfetto trace file, for a notebook on another host."""

    data: bytes


@dataclass(frozen=True, kw_only=True)
class StepRecord(_Reply):
    """One trainer step on one rank (``workbench.engine.timeline``): its spans per lane."""

    version: int
    run: str
    rank: int
    step: int
    wall_start: float
    duration: float
    spans: tuple[dict, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class StepRecords:
    """A rank's last step records, oldest first."""

    records: tuple[StepRecord, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PipelineStageRun(_Reply):
    """A stage's latest pipeline step as it ran: ``blocks`` are ``[F|B, microbatch, start, end]``."""

    stage: int
    n_stages: int
    schedule: str
    microbatches: int
    wall_start: float
    duration: float
    torch_order: Any = None
    blocks: tuple[tuple, ...] = ()


# ----------------------------------------------------------------------------- prepare, layout, planner
@dataclass(frozen=True, kw_only=True)
class ProbeReport:
    """Rank 0 before ``prepare``: variables ``missing`` on it, or why the spec does not fit."""

    missing: tuple[str, ...] = ()
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class LayoutReply(_Reply):
    """Which elements of which tensor this rank holds (``workbench.strategies.layout``'s
    schema, version 1); ``to_dict`` is the layout description the figures read."""

    _OMIT_NONE: ClassVar[tuple[str, ...]] = ("degrees", "blocks")

    version: int
    strategy: str
    path: str
    mesh: dict
    rank: int
    world_size: int
    params: tuple[dict, ...]
    param_bytes_local: int
    param_bytes_global: int
    notes: tuple[str, ...] = ()
    data: dict = field(default_factory=dict)
    degrees: dict | None = None
    blocks: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class CensusReply:
    """One census step on a rank: ``census`` is :func:`workbench.engine.memory_census.census`'s
    versioned record (what the pure planner compares); beside it the attention kernel seen,
    why it is believed, and the model's config (None: the model has no config the planner reads)."""

    census: dict
    attention: str | None = None
    attention_evidence: str = ""
    model_config: dict | None = None

    def record(self) -> dict:
        """The census with the rest beside it: the record per rank ``planner.live.compare`` reads."""
        extra = {"attention": self.attention, "attention_evidence": self.attention_evidence}
        return {**self.census, **extra, "model_config": self.model_config}


# ----------------------------------------------------------------------------- code that travels
@dataclass(frozen=True, kw_only=True)
class Host(_Reply):
    """The host an engine runs on."""

    host: str


@dataclass(frozen=True, kw_only=True)
class Stored(_Reply):
    """Bytes a host's cache took in."""

    bytes: int


@dataclass(frozen=True, kw_only=True)
class HostEnvironment(_Reply):
    """A host's Python and the versions its Python imports (distribution -> version, None: not
    installed), and a digest of its workbench's sources."""

    host: str
    python: str
    versions: dict
    workbench_digest: str


@dataclass(frozen=True, kw_only=True)
class SyncPlanned(_Reply):
    """Where a host keeps its copy of a folder, and which contents its cache lacks."""

    host: str
    tree: str
    missing: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SyncCheckedOut(_Reply):
    """A host's copy of a folder once it holds the notebook's files."""

    host: str
    tree: str
    digest: str
    written: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    size: int = 0


@dataclass(frozen=True, kw_only=True)
class Reloaded(_Reply):
    """The modules one rank reloaded from changed files, and those it could not (name, why)."""

    host: str
    reloaded: tuple[str, ...] = ()
    not_reloaded: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, kw_only=True)
class SyncEdited(_Reply):
    """One rank's part of an edit: per folder applied (it wrote the files), found (another rank
    of its host had) or out of step (the host's copy needs a full sync); then its reloads."""

    host: str
    outcomes: tuple[tuple[str, str], ...]
    reloaded: Reloaded | None = None


# ----------------------------------------------------------------------------- runs
@dataclass(frozen=True, kw_only=True)
class TrainerState(_Reply):
    """One rank's trainer: its run, state, step and target (``state`` "none", ``step`` 0 and
    nothing else where no trainer was built); ``layout`` where the request built it."""

    _OMIT_NONE: ClassVar[tuple[str, ...]] = ("rank", "run", "target", "reason", "notes", "layout")

    state: str
    step: int
    rank: int | None = None
    run: str | None = None
    target: int | None = None
    reason: str | None = None
    notes: tuple[str, ...] | None = None
    layout: str | None = None


@dataclass(frozen=True, kw_only=True)
class StagedHparams:
    """The hyperparameters a rank staged, as it will apply them (its types)."""

    values: dict


@dataclass(frozen=True, kw_only=True)
class RunEnded:
    """Whether nothing of the run still works on this rank (its training thread and auto-save
    ended) within the time given, and the state it ended in."""

    rank: int
    ended: bool
    state: str


@dataclass(frozen=True, kw_only=True)
class Size:
    """A number of ranks."""

    n: int


# the exit status of a rank that ended itself because its replica cannot step on (fault-tolerant runs)
EXIT_REPLICA_LOST = 75


@dataclass(frozen=True, kw_only=True)
class ReplicaMember(_Reply):
    """One rank of a fault-tolerant run (``state`` "none", ``step`` 0 where it has none): its replica,
    the quorum of its newest step, the steps it healed at and whether its last step waits for a
    lost replica."""

    _OMIT_NONE: ClassVar[tuple[str, ...]] = (
        "run",
        "rank",
        "replica",
        "group_rank",
        "reason",
        "target",
        "quorum",
        "heals",
        "waiting",
        "wait_rounds",
        "wait_s",
    )

    state: str
    step: int
    run: str | None = None
    rank: int | None = None
    replica: int | None = None
    group_rank: int | None = None
    reason: str | None = None
    target: int | None = None
    quorum: int | None = None
    heals: tuple[int, ...] | None = None
    waiting: bool | None = None
    wait_rounds: int | None = None
    wait_s: float | None = None


@dataclass(frozen=True)
class LogExcerpt:
    """What one rank's log file gave (``shared.rank_logs``): lines as ``(number, text)``
    (numbered from 1 where known, 0 for a tail), the lines that matched a pattern, shown or not,
    and why nothing could be read, where nothing could."""

    path: str
    size: int  # bytes in the file (0: no file)
    lines: tuple[tuple[int, str], ...]
    matched: int = 0
    note: str = ""
