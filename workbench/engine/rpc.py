"""Every call the notebook makes on the ranks, as typed requests: this file is the whole protocol.

The notebook applies :func:`handle` with a frozen request (``rs.apply(rpc.handle,
rpc.SaveCheckpoint(root, tag=...))``; through the broadcast tree wrapped in :func:`fanned`)
whose ``run`` is the rank-side half, so no notebook module is imported on a rank and no rank
function is called by name. Replies are frozen dataclasses of :mod:`workbench.shared.replies`
or plain data; nothing here imports torch at module level, so the notebook can unpickle and
build both without it. Trainer flags go through :mod:`workbench.engine.control`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..shared import debug_wire, replies


def handle(request):
    """Runs on a rank: carry out ``request`` and return its reply."""
    return request.run()


def fanned(fn, *args, **kwargs):
    """Runs on a rank for a call sent through the broadcast tree: ``fn`` (:func:`handle`, or the
    user's function of ``api.apply``) as ``(published, error, value)``, never raising there."""
    from . import fanout

    return fanout.run(fn, *args, **kwargs)


# ----------------------------------------------------------------------------- cells
@dataclass(frozen=True)
class RunCell:
    """A ``%%distrain`` cell's code, run in the rank's user namespace (``cell_runner``).

    What the cell prints, displays, returns and raises arrives as the request's IOPub
    messages, as from an execute request; the reply counts them. ``debug``: see
    :class:`~workbench.shared.debug_wire.CellDebug`.
    """

    AS_CELL: ClassVar[bool] = True  # its error is an output message (as a cell's), not a raise

    code: str
    debug: debug_wire.CellDebug | None = None  # the notebook's debug link, the cell's origin, breakpoints
    limit: int | None = None  # characters each output stream passes on (the rest: the rank's log)

    def run(self) -> replies.CellRun:
        from . import cell_runner

        return replies.CellRun(published=cell_runner.run(self.code, self.debug, self.limit))


@dataclass(frozen=True, kw_only=True)
class ReadLog:
    """``%distrain logs`` for a rank whose log file is not on the notebook's host: the rank
    reads its own (``shared.rank_logs``)."""

    tail: int | None = None
    grep: str | None = None
    limit: int = 1 << 20

    def run(self) -> replies.LogExcerpt:
        from ..shared import rank_logs
        from . import rank_log

        file = rank_log.current_path()
        if file is None:
            return replies.LogExcerpt("", 0, (), note="this rank keeps no log (started without a state folder)")
        return rank_logs.read(file, tail=self.tail, grep=self.grep, limit=self.limit)


# ----------------------------------------------------------------------------- checkpoints
@dataclass(frozen=True, kw_only=True)
class SaveCheckpoint:
    """Checkpoint this rank's part into ``root``."""

    root: str
    tag: str | None = None
    async_: bool = False
    with_optimizer: bool = True

    def run(self) -> replies.SaveInfo:
        from . import checkpoint_hooks

        info = checkpoint_hooks.rank_save(self.root, self.tag, self.async_, None, False, self.with_optimizer)
        return replies.SaveInfo.from_dict(info)


@dataclass(frozen=True, kw_only=True)
class WaitForSave:
    """Wait for the background save: its info once written, None when none was running."""

    timeout: float | None = None

    def run(self) -> replies.SaveInfo | None:
        from . import checkpoint_hooks

        info = checkpoint_hooks.rank_wait(self.timeout)
        return None if info is None else replies.SaveInfo.from_dict(info)


@dataclass(frozen=True, kw_only=True)
class LoadCheckpoint:
    """Load ``folder`` into this rank (all or nothing across the ranks)."""

    folder: str
    model_only: bool = False

    def run(self) -> replies.LoadReply:
        from ..shared.checkpoint.integrity import Problem
        from . import checkpoint_hooks

        info = checkpoint_hooks.rank_load(self.folder, self.model_only)
        if "damaged" in info:
            return replies.LoadReply(damaged=tuple(Problem(**d) for d in info["damaged"]))
        return replies.LoadReply(info=replies.LoadInfo.from_dict(info))


@dataclass(frozen=True, kw_only=True)
class VerifyCheckpoint:
    """Check ``folder``'s files, each by the rank that reads it (collective)."""

    folder: str

    def run(self) -> replies.Problems:
        from ..shared.checkpoint.integrity import Problem
        from . import checkpoint_hooks

        return replies.Problems(problems=tuple(Problem(**d) for d in checkpoint_hooks.rank_verify(self.folder)))


@dataclass(frozen=True, kw_only=True)
class SetAutosave:
    """Install (``every``) or remove (``every=None``) the auto-save hook."""

    root: str | None = None
    every: int | None = None
    keep: int = 3
    async_: bool = False

    def run(self) -> None:
        from . import checkpoint_hooks

        if self.every:
            checkpoint_hooks.set_autosave(self.root, self.every, self.keep, self.async_)
        else:
            checkpoint_hooks.set_autosave(None, None)


@dataclass(frozen=True, kw_only=True)
class StageAutosave:
    """Stage the installed hook on this rank's trainer at change ``version`` (where a trainer
    took it, :class:`CommitTrainer` follows)."""

    version: int

    def run(self) -> replies.Staged:
        from . import checkpoint_hooks

        return replies.Staged(staged=bool(checkpoint_hooks.stage_autosave(self.version)))


@dataclass(frozen=True, kw_only=True)
class CommitTrainer:
    """Commit a staged change on this rank's trainer."""

    version: int

    def run(self) -> None:
        from . import staging

        staging.commit(self.version)


@dataclass(frozen=True)
class NextVersion:
    """The trainer's next change version."""

    def run(self) -> replies.Version:
        from . import staging

        return replies.Version(version=int(staging.next_version()))


@dataclass(frozen=True, kw_only=True)
class ExportWeights:
    """Write one consolidated model file (``hf``: a Hugging Face folder)."""

    folder: str
    path: str
    dtype: str | None = None
    hf: bool = False
    merged: bool = False  # an adapter checkpoint merged into its saved base (a model folder)
    adapter: bool = False  # an adapter checkpoint as peft's adapter folder

    def run(self) -> replies.ExportInfo:
        from .checkpoint.adapter_export import export_adapter, export_merged
        from .checkpoint.export import export_hf, export_safetensors

        if self.merged:
            export = export_merged
        elif self.adapter:
            export = export_adapter
        else:
            export = export_hf if self.hf else export_safetensors
        return replies.ExportInfo.from_dict(export(self.folder, self.path, dtype=self.dtype))


# ----------------------------------------------------------------------------- profiles, timelines
@dataclass(frozen=True, kw_only=True)
class Profile:
    """``action``: arm (the next ``steps`` trainer steps into ``folder``), status, cancel, read
    (the reply is the :class:`~workbench.shared.replies.Trace`) or code (profile ``code`` in the
    rank's namespace); the others reply with the profiler's state."""

    action: str
    steps: int = 0
    folder: str = ""
    code: str = ""
    partial: str = ""  # arm on some ranks only (these, e.g. "1"): an idle trainer is refused

    def run(self) -> replies.ProfileState | replies.Trace:
        from . import profiling

        actions = {
            "arm": lambda: profiling.arm(self.steps, self.folder, partial=self.partial),
            "code": lambda: profiling.profile_code(self.code, self.folder),
            "status": profiling.status,
            "cancel": profiling.cancel,
        }
        if self.action == "read":
            return replies.Trace(data=profiling.read_trace())
        if self.action not in actions:
            raise ValueError(f"unknown profile action {self.action!r}: {', '.join(actions)}, read")
        return replies.ProfileState.from_dict(actions[self.action]())


@dataclass(frozen=True, kw_only=True)
class RecentSteps:
    """The rank's last ``steps`` step records (of ``run_id``, default the latest run)."""

    steps: int
    run_id: str | None = None

    def run(self) -> replies.StepRecords:
        from . import timeline

        recs = timeline.recent(self.steps, self.run_id)
        return replies.StepRecords(records=tuple(replies.StepRecord.from_dict(r) for r in recs))


@dataclass(frozen=True)
class PipelineRun:
    """This stage's latest pipeline step as it ran (``PipelinePrepared.last_run``)."""

    def run(self) -> replies.PipelineStageRun:
        from .session import prepared as current_prepared

        prepared = current_prepared()
        if not hasattr(prepared, "last_run"):
            raise ValueError(
                f"the ranks' model is prepared with {prepared.layout['strategy']!r}, not pipeline "
                "parallel: `%distrain prepare pp` first"
            )
        return replies.PipelineStageRun.from_dict(prepared.last_run)


# ----------------------------------------------------------------------------- prepare, layout, planner
@dataclass(frozen=True, kw_only=True)
class ProbeModel:
    """On rank 0 before ``prepare``: are the variables there, and does the spec fit the world
    and the model (degrees, blocks, tensor-parallel plan, pipeline split)?"""

    model_name: str
    opt_name: str
    spec: dict
    world_size: int
    device_type: str
    blocks: tuple[str, ...] | None = None

    def run(self) -> replies.ProbeReport:
        from .prepare_cell import probe

        missing, error = probe(
            self.model_name, self.opt_name, self.spec, self.world_size, self.device_type, self.blocks
        )
        return replies.ProbeReport(missing=tuple(missing), error=error)


@dataclass(frozen=True)
class Layout:
    """Which elements of which tensor this rank holds (``Prepared.layout``)."""

    def run(self) -> replies.LayoutReply:
        from .session import current_layout

        return replies.LayoutReply.from_dict(current_layout())


@dataclass(frozen=True, kw_only=True)
class Census:
    """One census training step of the current Prepared (``%distrain plan --live``), with the
    attention kernel seen and the model's config."""

    batch_size: int = 8

    def run(self) -> replies.CensusReply:
        from .memory_census import census_of_current

        return replies.CensusReply(**census_of_current(self.batch_size))


# ----------------------------------------------------------------------------- code that travels
@dataclass(frozen=True)
class HostName:
    """Before the bootstrap: this engine's host name (which engines share a host)."""

    def run(self) -> replies.Host:
        import socket

        return replies.Host(host=socket.gethostname())


@dataclass(frozen=True, kw_only=True)
class HostEnvironment:
    """Before the bootstrap, on one engine per host: its Python and the versions of torch, the
    workbench and ``packages`` (distribution names) as its Python imports them."""

    packages: tuple[str, ...] = ()

    def run(self) -> replies.HostEnvironment:
        from . import host_environment

        return host_environment.report(self.packages)


@dataclass(frozen=True, kw_only=True)
class SyncPlan:
    """On one rank per host: where the copy of folder ``key`` lives, and which of ``shas`` the
    host's cache lacks (temporaries of writers that are gone are swept first)."""

    key: str
    shas: tuple[str, ...]

    def run(self) -> replies.SyncPlanned:
        from . import code_cache

        return code_cache.plan(self.key, self.shas)


@dataclass(frozen=True, kw_only=True)
class SyncBlobs:
    """Contents for the host's cache as ``(sha, offset, total size, bytes)`` parts."""

    parts: tuple[tuple[str, int, int, bytes], ...]

    def run(self) -> replies.Stored:
        from . import code_cache

        return replies.Stored(bytes=code_cache.put(self.parts))


@dataclass(frozen=True, kw_only=True)
class SyncCheckout:
    """On one rank per host: make the copy of folder ``key`` hold ``entries`` (from the cache)."""

    key: str
    entries: tuple  # of shared.code_tree.FileEntry

    def run(self) -> replies.SyncCheckedOut:
        from . import code_cache

        return code_cache.checkout_reply(self.key, self.entries)


@dataclass(frozen=True, kw_only=True)
class SyncEnter:
    """On every rank of a synced host: import from the copies (``(notebook folder, copy)``) and
    run in ``cwd``; then reload the modules imported from ``changed`` (copy -> paths)."""

    trees: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    changed: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def run(self) -> replies.Reloaded:
        from . import code_reload

        if self.trees or self.cwd:
            code_reload.entered(self.trees, self.cwd)
        return code_reload.reload_changed({tree: set(paths) for tree, paths in self.changed})


@dataclass(frozen=True, kw_only=True)
class SyncEdit:
    """Before a cell, on every rank of the synced hosts and of ``here`` (the notebook's host): the
    folders' edits (``FolderEdit``s, contents inline); the first rank of a synced host writes them,
    the others find them written; ranks on ``here`` read the folders themselves. Then each rank
    reloads the modules it imported from the changed files."""

    edits: tuple  # of shared.code_tree.FolderEdit
    here: str = ""

    def run(self) -> replies.SyncEdited:
        from . import code_reload

        return code_reload.apply_edits(self.edits, self.here)


@dataclass(frozen=True, kw_only=True)
class Prepare:
    """Lay ``model_name``/``opt_name`` out with ``spec`` (``engine.prepare``; ``ProbeModel`` first),
    rebind both and ``prepared`` in the rank's namespace; the reply is the new layout. A failure
    is shown as a cell's, from here down (and kept for ``%distrain debug``); nothing is rebound."""

    AS_CELL: ClassVar[bool] = True

    model_name: str
    opt_name: str
    spec: dict
    device_type: str
    blocks: tuple[str, ...] | None = None

    def run(self) -> replies.LayoutReply | None:
        from .prepare_cell import prepare_in_namespace

        layout = prepare_in_namespace(self.model_name, self.opt_name, self.spec, self.device_type, self.blocks)
        return None if layout is None else replies.LayoutReply.from_dict(layout)


# ----------------------------------------------------------------------------- the rank itself
@dataclass(frozen=True, kw_only=True)
class Identity:
    """Before the bootstrap: host, pid, launcher ranks, host slot, and this host's address on the
    route to ``toward`` (the notebook), which other hosts reach the rank by."""

    toward: str | None = None

    def run(self) -> dict:
        from . import runtime

        return runtime.identity(self.toward)


@dataclass(frozen=True)
class FreePort:
    """A TCP port free on this rank's host now (a rendezvous port for rank 0)."""

    def run(self) -> int:
        from . import runtime

        return runtime.free_port()


@dataclass(frozen=True, kw_only=True)
class Bootstrap:
    """Make this engine rank ``rank``: environment, threads, device, process group
    (``runtime.bootstrap``); the reply is the rank's description (``runtime.describe``)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    backend: str
    timeout_s: float
    threads: int
    gpu_ids: tuple[int, ...] | None = None
    stack_dir: str | None = None
    sys_path: tuple[str, ...] = ()
    parent_pid: int | None = None  # the notebook: this rank ends with it (on its host)
    also_end: tuple[int, ...] | None = None  # rank 0: the controller's pids, ended with it
    pin_visible_gpu: bool = False
    interface_addr: str | None = None
    framework: str = "torch"
    extra_env: dict | None = None
    process_group: bool = True  # False: a lost replica's replacement (fault tolerance)
    store_file: str | None = None

    def run(self) -> dict:
        from . import runtime

        return runtime.bootstrap(**vars(self))


@dataclass(frozen=True)
class BootstrapEach:
    """One request for a large set, through the broadcast tree: each engine runs its own
    :class:`Bootstrap` from ``table`` (engine id -> request)."""

    table: dict

    def run(self) -> dict:
        from IPython import get_ipython

        return self.table[get_ipython().kernel.engine_id].run()


@dataclass(frozen=True)
class LeaveGroup:
    """Destroy this rank's process group, so that peers blocked in a collective with it fail at
    once (a straggler's release); True where there was a group."""

    def run(self) -> bool:
        from . import runtime

        return runtime.leave_group()


@dataclass(frozen=True, kw_only=True)
class RejoinGroup:
    """A new default process group, same ranks, rendezvous at ``master_port`` (after
    :class:`LeaveGroup` on every rank); the reply is the rank's description."""

    master_port: int

    def run(self) -> dict:
        from . import runtime

        return runtime.rejoin_group(self.master_port)


@dataclass(frozen=True, kw_only=True)
class Rehome:
    """From now on this rank ends with process ``owner_pid`` (``detach``: the keeper; ``attach``:
    the kernel that took the set back)."""

    owner_pid: int

    def run(self) -> dict:
        from . import runtime

        return runtime.rehome(self.owner_pid)


@dataclass(frozen=True)
class SetNames:
    """``%distrain push`` through the broadcast tree (a direct view pushes itself); build it with
    :meth:`of`, which sends a notebook's functions and classes by value as ipyparallel's push does."""

    namespace: dict

    @classmethod
    def of(cls, namespace: dict) -> SetNames:
        from types import FunctionType

        from ipyparallel.serialize import can

        return cls({k: can(v) if isinstance(v, (FunctionType, type)) else v for k, v in namespace.items()})

    def run(self) -> None:
        from . import fanout

        fanout.set_names(self.namespace)


@dataclass(frozen=True)
class GetName:
    """``%distrain pull`` through the broadcast tree: ``name``'s value in the rank's namespace."""

    name: str

    def run(self) -> Any:
        from . import fanout

        return fanout.get_name(self.name)


@dataclass(frozen=True, kw_only=True)
class SharedDirStep:
    """One step of the check that every host shares ``folder`` (``engine.shared_dir``): rank 0
    leaves ``token`` ("leave", replies its host), every rank looks for it and leaves its own
    ("answer", replies what it saw), rank 0 lists the ranks it sees ("collect")."""

    step: str
    folder: str
    token: str
    world_size: int = 0

    def run(self) -> str | dict | list:
        from . import runtime, shared_dir

        if self.step == "leave":
            return shared_dir.leave_token(self.folder, self.token)
        if self.step == "answer":
            return shared_dir.see_and_answer(self.folder, self.token, runtime.context().rank)
        if self.step == "collect":
            return shared_dir.collect(self.folder, self.token, self.world_size)
        raise ValueError(f"unknown shared-folder step {self.step!r}: leave, answer, collect")


# ----------------------------------------------------------------------------- runs: the trainer
@dataclass(frozen=True, kw_only=True)
class BuildTeachingTrainer:
    """The teaching trainer (``control.build_default``: a GPT preset on the bundled text) under
    ``strategy``; ``options``: its batch size, learning rate and trainer settings."""

    strategy: str = "ddp"
    model: str = "tiny"
    options: dict = field(default_factory=dict)

    def run(self) -> replies.TrainerState:
        from . import control

        return replies.TrainerState.from_dict(control.build_default(self.strategy, model=self.model, **self.options))


@dataclass(frozen=True, kw_only=True)
class StartTraining:
    """Run ``steps`` more steps of this rank's trainer in the background."""

    steps: int

    def run(self) -> replies.TrainerState:
        from . import control

        return replies.TrainerState.from_dict(control.start(self.steps))


@dataclass(frozen=True, kw_only=True)
class ControlTraining:
    """``action``: pause (with ``reason``), resume or stop, at the step every rank agrees on."""

    action: str
    reason: str = ""

    def run(self) -> replies.TrainerState:
        from . import control

        return replies.TrainerState.from_dict(control.request(self.action, self.reason))


@dataclass(frozen=True)
class TrainerStatus:
    """This rank's trainer state ("none" where none was built)."""

    def run(self) -> replies.TrainerState:
        from . import control

        return replies.TrainerState.from_dict(control.status())


@dataclass(frozen=True, kw_only=True)
class StageHparams:
    """Check and hold hyperparameter changes under change ``version`` (:class:`CommitTrainer` applies them)."""

    version: int
    values: dict

    def run(self) -> replies.StagedHparams:
        from . import control

        return replies.StagedHparams(values=control.stage(self.version, dict(self.values)))


@dataclass(frozen=True, kw_only=True)
class InjectFault:
    """Fault drill: a NaN/Inf loss or (``oom``) a simulated out-of-memory at ``step`` on this rank."""

    kind: str = "nan"
    step: int | None = None

    def run(self) -> replies.TrainerState:
        from . import control

        return replies.TrainerState.from_dict(control.inject(self.kind, self.step))


@dataclass(frozen=True, kw_only=True)
class LargestSize:
    """The most ranks, at most ``room``, the teaching trainer runs ``strategy`` on (a lost host)."""

    strategy: str
    room: int
    batch_size: int | None = None

    def run(self) -> replies.Size:
        from . import control

        return replies.Size(n=int(control.largest_size(self.strategy, self.room, self.batch_size)))


@dataclass(frozen=True, kw_only=True)
class EndOfRun:
    """Wait (at most ``timeout``) until nothing of run ``run_id`` still works on this rank: its
    training thread has ended and a background save has been written. "Finished" is final only
    then: a run's thread sends its last events and may still be saving after it says so."""

    run_id: str
    timeout: float = 30.0

    def run(self) -> replies.RunEnded:
        from .control import end_of_run

        rank, ended, state = end_of_run(self.run_id, self.timeout)
        return replies.RunEnded(rank=rank, ended=ended, state=state)


# ----------------------------------------------------------------------------- runs: torchft replicas
@dataclass(frozen=True, kw_only=True)
class StartFaultTolerant:
    """Build this rank's member of a fault-tolerant run from the notebook's ``plan``; with ``begin``
    start stepping at once (else :class:`BeginFaultTolerant` does, once every member is built)."""

    plan: dict
    begin: bool = True

    def run(self) -> replies.ReplicaMember:
        from . import fault_tolerant

        return replies.ReplicaMember.from_dict(fault_tolerant.start(dict(self.plan), begin=self.begin))


@dataclass(frozen=True)
class BeginFaultTolerant:
    """Start stepping the member :class:`StartFaultTolerant` built."""

    def run(self) -> replies.ReplicaMember:
        from . import fault_tolerant

        return replies.ReplicaMember.from_dict(fault_tolerant.begin())


@dataclass(frozen=True)
class FaultTolerantStatus:
    """This rank's member of the fault-tolerant run ("none" where it has none)."""

    def run(self) -> replies.ReplicaMember:
        from . import fault_tolerant

        return replies.ReplicaMember.from_dict(fault_tolerant.status())


@dataclass(frozen=True, kw_only=True)
class StopFaultTolerantAt:
    """End the member's loop after ``step`` (the same step on every rank: ``train stop``)."""

    step: int

    def run(self) -> replies.ReplicaMember:
        from . import fault_tolerant

        return replies.ReplicaMember.from_dict(fault_tolerant.stop_at(self.step))


@dataclass(frozen=True)
class FinishWithoutLostReplica:
    """A lost replica will not be back (its replacement failed): take the last step without it."""

    def run(self) -> replies.ReplicaMember:
        from . import fault_tolerant

        return replies.ReplicaMember.from_dict(fault_tolerant.finish_alone())


# ----------------------------------------------------------------------------- the event stream, the debugger
@dataclass(frozen=True)
class ConnectStream:
    """Point this rank's event stream at the collector listening at ``address`` (its HMAC ``key``
    arrives over ipyparallel's signed channel)."""

    address: str
    key: bytes

    def run(self) -> None:
        from . import publisher

        publisher.connect(self.address, key=self.key)


@dataclass(frozen=True, kw_only=True)
class PostMortem:
    """pdb post-mortem on this rank's last exception (``%distrain debug``), over the rank set's
    debug ``link`` (the cell that raised may have named another); the reply says how it ended."""

    link: debug_wire.LinkAddress | None = None

    def run(self) -> str:
        from . import rank_debug

        return rank_debug.post_mortem(self.link)
