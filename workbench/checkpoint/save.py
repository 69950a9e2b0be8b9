"""Saving a distributed checkpoint, synchronously or in the background (runs on every rank).

Every rank writes its own part with ``torch.distributed.checkpoint`` into
``ROOT/NAME.tmp-TOKEN/`` (DCP writes ``.metadata`` once all parts are written), plus a
``rank-RRRRR.json`` of its RNG states. Then a barrier; then rank 0 writes
``manifest.json``, fsyncs it and the folder, and renames ``NAME.tmp-TOKEN`` to ``NAME``
(replacing an older checkpoint of the same name only after the new one is whole). A
crash or kill anywhere before the rename leaves a ``*.tmp-*`` folder that is never
listed or loaded (and is cleaned on the next save); the previous checkpoint is never
touched.

Async: the state is first copied to CPU memory on the training thread (the only time
training is blocked), then written by one background thread per rank. Checkpoint
collectives run on a process group of their own (gloo), so they do not interleave
with training's collectives. A new save or a load first waits for the one in flight
(:func:`wait`): two saves never race.
"""
from __future__ import annotations

import json
import os
import random
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from . import catalog
from .manifest import MANIFEST, Manifest, check_tag, fsync_dir, step_name, write_json_atomic
from .pretrained import model_config
from .state import Target, capture, rng_state, split_optimizer, tensor_shapes

from .manifest import quiet_single_process as _quiet_single_process

__all__ = ["save", "wait", "pending", "ckpt_group", "DRILL", "SaveError", "rank_file"]

# Fault drills: seconds to pause at a point of the save, so a test can kill a rank there.
DRILL: dict[str, float] = {"after_parts": 0.0}
STALE_TEMP_S = 120.0  # a *.tmp-* folder older than this is a killed save's leftover

_EXECUTOR: ThreadPoolExecutor | None = None
_PENDING: Future | None = None
_PG = None
_LOCK = threading.Lock()


class SaveError(RuntimeError):
    pass


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.json"


def _dist():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def ckpt_group():
    """A gloo group of all ranks used only by checkpoint collectives (created on first use)."""
    global _PG
    dist = _dist()
    if dist is None:
        return None
    if _PG is None:
        _PG = dist.new_group(backend="gloo")
    return _PG


def pending() -> Future | None:
    return _PENDING


def wait(timeout: float | None = None) -> dict | None:
    """Wait for the save in flight (if any); return its result, re-raise its error."""
    global _PENDING
    fut = _PENDING
    if fut is None:
        return None
    try:
        return fut.result(timeout=timeout)
    finally:
        if fut.done():
            _PENDING = None if _PENDING is fut else _PENDING


def _agree_token(pg) -> int:
    t = torch.tensor([random.SystemRandom().getrandbits(47)], dtype=torch.int64)
    dist = _dist()
    if dist is not None:
        dist.broadcast(t, src=0, group=pg)
    return int(t.item())


_STAGE_CACHE: dict[str, torch.Tensor] = {}  # CPU buffers reused by the next async save (no page faults)


def _stage(state: dict, prefix: str = "") -> dict:
    """Copy every tensor to CPU memory of its own (training may change the originals next step).

    Buffers are kept and reused by the next async save of the same shapes (the previous
    save has always finished by then: saves are serialized). DTensors keep their
    placement: the local shard is copied and re-wrapped.
    """
    out = {}
    for k, v in state.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out[k] = _stage(v, key + ".")
        elif isinstance(v, torch.Tensor):
            out[k] = _stage_tensor(key, v)
        else:
            out[k] = v
    return out


def _stage_tensor(key: str, v: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    local = v.to_local() if isinstance(v, DTensor) else v
    buf = _STAGE_CACHE.get(key)
    if buf is None or buf.shape != local.shape or buf.dtype != local.dtype:
        buf = torch.empty(local.shape, dtype=local.dtype, device="cpu",
                          pin_memory=local.is_cuda and torch.cuda.is_available())
        _STAGE_CACHE[key] = buf
    buf.copy_(local.detach(), non_blocking=local.is_cuda)
    if isinstance(v, DTensor):
        return DTensor.from_local(buf, v.device_mesh, v.placements, run_check=False, shape=v.shape, stride=v.stride())
    return buf


def save(target: Target, root: str, *, tag: str | None = None, async_: bool = False, auto: bool = False,
         keep: int | None = None, with_optimizer: bool = True) -> dict:
    """Save ``target`` under ``root`` (collective: call on every rank).

    Returns ``{"name", "step", "blocked_s", ...}``; for ``async_`` the write continues in
    the background (``wait()`` returns its final result). ``keep``: retention of auto-saves.
    """
    global _PENDING, _EXECUTOR
    wait()  # serialize: never two saves in flight
    t0 = time.perf_counter()
    dist = _dist()
    pg = ckpt_group()
    rank = dist.get_rank() if dist else 0
    world = dist.get_world_size() if dist else 1
    name = check_tag(tag) if tag else step_name(target.state.step)
    root = os.path.abspath(root)
    token = _agree_token(pg)
    tmp = os.path.join(root, catalog.temp_name(name, token))
    msd, osd = capture(target, with_optimizer=with_optimizer)
    otensors, ovalues = split_optimizer(osd)
    state = {"model": msd}
    if otensors:
        state["optim"] = otensors
    if async_:
        state = _stage(state)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the non-blocking device-to-host copies are done
    rank_info = {"rank": rank, "world_size": world, "step": target.state.step, "data": target.state.data,
                 "rng": rng_state()}
    manifest = Manifest(
        name=name, tag=tag, step=int(target.state.step), time=0.0, world_size=world, strategy=target.strategy,
        spec=target.spec, mesh=target.mesh, loss=target.state.loss, data=dict(target.state.data or {}),
        auto=auto, async_save=async_, has_optimizer=bool(otensors),
        optimizer=type(getattr(target.optimizer, "optimizer", target.optimizer)).__name__ if target.optimizer is not None else None,
        model_tensors=tensor_shapes(msd), optim_tensors=tensor_shapes(otensors), optim_values=ovalues,
        rank_files=[rank_file(r) for r in range(world)], torch_version=torch.__version__,
        model_config=model_config(target.model),
    )
    blocked = time.perf_counter() - t0

    def job() -> dict:
        return _write_and_commit(state, rank_info, root, tmp, name, manifest, pg, rank, keep, t0)

    if not async_:
        info = job()
        info["blocked_s"] = time.perf_counter() - t0
        return info
    with _LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbench-ckpt")
        _PENDING = _EXECUTOR.submit(job)
    return {"name": name, "step": manifest.step, "async": True, "blocked_s": blocked, "path": os.path.join(root, name)}


def _write_and_commit(state, rank_info, root, tmp, name, manifest: Manifest, pg, rank, keep, t0) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    dist = _dist()
    if rank == 0:  # leftovers of saves killed earlier (not younger ones: another notebook may share root)
        catalog.clean_temp(root, older_than=STALE_TEMP_S)
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, rank_file(rank)), "w", encoding="utf-8") as fh:
        json.dump(rank_info, fh)
        fh.flush()
        os.fsync(fh.fileno())
    writer = FileSystemWriter(tmp, single_file_per_rank=True, sync_files=True, thread_count=1)
    with _quiet_single_process():
        dcp.save(state, storage_writer=writer, process_group=pg, no_dist=dist is None)
    if DRILL.get("after_parts"):
        time.sleep(DRILL["after_parts"])
    if dist is not None:
        dist.barrier(group=pg)  # every rank's part and rank file are on disk
    final = os.path.join(root, name)
    err = None
    if rank == 0:
        try:
            _commit(tmp, final, manifest, t0)
            if keep:
                catalog.apply_retention(root, keep, protect=final)
        except Exception as exc:  # tell the other ranks, then raise
            err = exc
    ok = torch.tensor([0 if err else 1])
    if dist is not None:
        dist.broadcast(ok, src=0, group=pg)
    if err is not None:
        raise err
    if not int(ok.item()):
        raise SaveError(f"rank 0 could not commit checkpoint {name!r} (see rank 0's error); the previous one is intact")
    return {"name": name, "step": manifest.step, "path": final, "async": manifest.async_save,
            "save_s": time.perf_counter() - t0}


def _commit(tmp: str, final: str, manifest: Manifest, t0: float) -> None:
    files = {}
    for dirpath, _, names in os.walk(tmp):
        for n in names:
            p = os.path.join(dirpath, n)
            files[os.path.relpath(p, tmp)] = os.path.getsize(p)
    missing = [f for f in manifest.rank_files if f not in files]
    if missing or ".metadata" not in files:
        raise SaveError(f"checkpoint {manifest.name!r} is incomplete (missing {missing or ['.metadata']})")
    manifest.files = files
    manifest.bytes = sum(files.values())
    manifest.time = time.time()
    manifest.save_seconds = time.perf_counter() - t0
    write_json_atomic(os.path.join(tmp, MANIFEST), None, text=manifest.to_json())
    fsync_dir(tmp)
    old = None
    if os.path.exists(final):  # same name saved again: the new one replaces it whole
        old = f"{final}.old-{os.path.basename(tmp)[-12:]}"
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_dir(os.path.dirname(final))
    if old:
        import shutil

        shutil.rmtree(old, ignore_errors=True)
