"""Loading a checkpoint into the live model, at any world size and strategy (every rank).

Each rank asks DCP for the tensors its model holds now and DCP reads those slices, so
resharding is DCP's. Files are verified, the metadata read safely and names and shapes
compared before any tensor is read; tensors go to staging storage and are applied only once
every rank has read its part, so a failed load never leaves a mix (docs/checkpoints.md)."""

from __future__ import annotations

import json
import os
import time

import torch

from ...shared.checkpoint import integrity
from ...shared.checkpoint.integrity import DamagedCheckpoint, Problem
from ...shared.checkpoint.manifest import Manifest, read_manifest
from ...shared.checkpoint.manifest import quiet_single_process as _quiet_single_process
from . import save as _save
from .adapters import check_base
from .safety import IncompatibleCheckpoint, compare, mismatch_message, read_metadata_file
from .state import Target, apply_state, capture_split, merge_optimizer, set_rng_state, split_optimizer

__all__ = ["load", "verify", "check_compatible", "DRILL", "LoadFailed"]

# Fault drill: seconds to pause once every tensor is read into staging, before it is applied.
DRILL: dict[str, float] = {"before_apply": 0.0}


def _gather_keys(keys: set[str], pg) -> set[str]:
    """Union of every rank's keys (pipeline stages each hold only some)."""
    from .save import _dist

    dist = _dist()
    if dist is None:
        return set(keys)
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, sorted(keys), group=pg)
    return set().union(*(set(o) for o in out))


def check_compatible(
    manifest: Manifest, msd: dict, otensors: dict, *, pg=None, with_optimizer: bool = True, optimizer: str | None = None
) -> None:
    """Raise :class:`IncompatibleCheckpoint` naming missing/unexpected/mis-shaped tensors."""
    wanted = {k: list(v.shape) for k, v in msd.items() if isinstance(v, torch.Tensor)}
    saved = {k: v[0] for k, v in manifest.model_tensors.items()}
    union = _gather_keys(set(wanted), pg)
    missing, _, shapes = compare(saved, wanted)
    unexpected = sorted(k for k in saved if k not in union)
    problems = _all_problems(missing, shapes, pg)
    msg = mismatch_message("model", problems[0], unexpected, problems[1])
    if msg:
        raise IncompatibleCheckpoint(msg)
    if with_optimizer:
        if optimizer and manifest.optimizer and optimizer != manifest.optimizer:
            raise IncompatibleCheckpoint(
                f"the checkpoint holds {manifest.optimizer} state but this model's optimizer is {optimizer}: "
                "use the same optimizer class, or load with --model-only (model_only=True) for a fresh optimizer"
            )
        if not manifest.has_optimizer and otensors:
            raise IncompatibleCheckpoint(
                "the checkpoint has no optimizer state: load it with model_only=True "
                "(`%distrain ckpt load ... --model-only`) to start a fresh optimizer"
            )
        owanted = {k: list(v.shape) for k, v in otensors.items()}
        osaved = {k: v[0] for k, v in manifest.optim_tensors.items()}
        ounion = _gather_keys(set(owanted), pg)
        omissing, _, oshapes = compare(osaved, owanted)
        ounexp = sorted(k for k in osaved if k not in ounion)
        problems = _all_problems(omissing, oshapes, pg)
        msg = mismatch_message(f"optimizer ({manifest.optimizer} state saved)", problems[0], ounexp, problems[1])
        if msg:
            raise IncompatibleCheckpoint(msg + "; or load with --model-only to start a fresh optimizer")


def _all_problems(missing, shapes, pg):
    """Every rank raises the same error (never one rank raising while others wait)."""
    from .save import _dist

    dist = _dist()
    if dist is None:
        return missing, shapes
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, (list(missing), [list(s) for s in shapes]), group=pg)
    m = sorted({k for o in out for k in o[0]})
    s = sorted({tuple(map(lambda x: tuple(x) if isinstance(x, list) else x, t)) for o in out for t in o[1]})
    return m, [(k, list(a), list(b)) for k, a, b in s]


class LoadFailed(RuntimeError):
    """A rank could not read its part of a checkpoint; no rank applied anything."""


def verify(folder: str, pg=None) -> list[Problem]:
    """Every problem of ``folder``, each file checked by the rank that reads it, in parallel
    (collective: call on every rank; every rank gets the same list)."""
    from .save import _all_gather, _dist

    dist = _dist()
    rank = dist.get_rank() if dist else 0
    world = dist.get_world_size() if dist else 1
    mine = integrity.verify_folder(folder, rank=rank, world=world)
    found = {p for ps in _all_gather(mine, pg) for p in ps}
    return sorted(found, key=lambda p: (p.what != "manifest", p.file))


def _staging(sd: dict) -> dict:
    """Storage of its own for every tensor of ``sd`` (DTensors keep their placement)."""
    return {k: torch.empty_like(v) if isinstance(v, torch.Tensor) else v for k, v in sd.items()}


def _nbytes(sd: dict) -> int:
    from torch.distributed.tensor import DTensor

    n = 0
    for v in sd.values():
        if isinstance(v, torch.Tensor):
            t = v.to_local() if isinstance(v, DTensor) else v
            n += t.numel() * t.element_size()
    return n


def _agree(ok: bool, pg) -> bool:
    """True when every rank is ready to apply; a dead peer raises here, before anything is applied."""
    from .save import _dist

    dist = _dist()
    if dist is None:
        return ok
    t = torch.tensor([1 if ok else 0], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=pg)
    return bool(t.item())


def load(target: Target, folder: str, *, model_only: bool = False, restore_rng: bool = True) -> dict:
    """Load the checkpoint in ``folder`` into ``target`` (collective: call on every rank).

    All or nothing: the files are verified first (:func:`verify`; a damaged checkpoint
    raises :class:`DamagedCheckpoint` on every rank), the tensors are read into staging
    storage, the ranks agree that every one of them has read its part, and only then are
    model, optimizer, step, data position and RNG replaced. Any failure before that point
    (a file, a dead peer, an incompatible model) leaves this rank's state as it was.
    """
    import torch.distributed.checkpoint as dcp

    from .safety import SafeLoadPlanner, SafeReader

    _save.wait()  # a save in flight finishes first
    t0 = time.perf_counter()
    dist = _save._dist()
    pg = _save.ckpt_group()
    rank = dist.get_rank() if dist else 0
    world = dist.get_world_size() if dist else 1
    problems = verify(folder, pg)
    if problems:
        raise DamagedCheckpoint(folder, problems)
    verify_s = time.perf_counter() - t0
    manifest = read_manifest(folder)
    read_metadata_file(folder)  # refuses tampered / pickled content before anything else
    rank_state = None
    rf = os.path.join(folder, _save.rank_file(rank))
    if restore_rng and os.path.exists(rf):
        with open(rf, encoding="utf-8") as fh:
            rank_state = json.load(fh)
    with_opt = not model_only and target.optimizer is not None
    msd, osd, frozen = capture_split(target, with_optimizer=with_opt)
    if manifest.adapter:
        check_base(manifest.adapter, target.model, frozen, folder, pg)
    otensors, _ = split_optimizer(osd)
    opt = getattr(target.optimizer, "optimizer", target.optimizer)
    check_compatible(
        manifest,
        msd,
        otensors,
        pg=pg,
        with_optimizer=with_opt,
        optimizer=type(opt).__name__ if opt is not None and not target.is_deepspeed else None,
    )
    state = {"model": _staging(msd)}  # the live tensors are never written by DCP
    if with_opt and otensors:
        state["optim"] = _staging(otensors)
    staging_bytes = sum(_nbytes(v) for v in state.values())
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with _quiet_single_process():
            dcp.load(
                state,
                storage_reader=SafeReader(folder),
                planner=SafeLoadPlanner(),
                process_group=pg,
                no_dist=dist is None,
            )
    except CheckpointException as exc:  # raised alike on every rank: one line, not torch's tracebacks
        raise LoadFailed(
            f"reading {os.path.basename(folder)} failed ({_save._dcp_failure(exc, 'read')}); nothing was "
            "applied: every rank's model, optimizer, step and RNG are as they were"
        ) from None
    if DRILL.get("before_apply"):
        time.sleep(DRILL["before_apply"])
    if not _agree(True, pg):  # pragma: no cover - a rank that failed raised in dcp.load on every rank
        raise RuntimeError("a rank could not read its part of the checkpoint; nothing was applied")
    # from here on nothing is collective: a peer dying now cannot stop this rank half-way
    full_osd = merge_optimizer(osd, state.get("optim", {}), manifest.optim_values) if with_opt else None
    apply_state(target, state["model"], full_osd)
    target.state.step = manifest.step
    target.state.loss = manifest.loss
    target.state.data = dict(manifest.data or {})
    notes = []
    if restore_rng:
        if rank_state is not None:
            set_rng_state(rank_state.get("rng", {}))
            if world != manifest.world_size:
                notes.append(
                    f"RNG: rank {rank} took saved rank {rank}'s state (world size {manifest.world_size} -> {world})"
                )
        else:
            notes.append(
                f"RNG: the checkpoint has no state for rank {rank} (saved on {manifest.world_size} ranks); "
                "this rank keeps its current RNG"
            )
    return {
        "name": manifest.name,
        "step": manifest.step,
        "loss": manifest.loss,
        "path": folder,
        "from_world_size": manifest.world_size,
        "from_strategy": manifest.strategy,
        "world_size": world,
        "strategy": target.strategy,
        "model_only": not with_opt,
        "load_s": time.perf_counter() - t0,
        "verify_s": verify_s,
        "staging_bytes": staging_bytes,
        "notes": notes,
    }
