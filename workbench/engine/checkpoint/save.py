"""Saving a distributed checkpoint, synchronously or in the background (runs on every rank).

Written into ``ROOT/NAME.tmp-TOKEN/`` and renamed into place only once every rank's files
are written, read back and recorded in ``manifest.json``, so a crash or a storage fault
never leaves a checkpoint that looks whole, and the previous one is never touched (the
steps: docs/checkpoints.md). An async save blocks training only to copy the state to CPU."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import sys
import threading
import time
import weakref
import zlib
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from ...shared.checkpoint import catalog, integrity
from ...shared.checkpoint.manifest import MANIFEST, Manifest, check_tag, fsync_dir, step_name, write_json_atomic
from ...shared.checkpoint.manifest import quiet_single_process as _quiet_single_process
from . import shard_writer
from .adapters import adapter_record, ensure_base
from .pretrained import model_config
from .state import Target, capture_split, rng_state, split_optimizer, tensor_shapes

__all__ = [
    "save",
    "wait",
    "pending",
    "ckpt_group",
    "DRILL",
    "SaveError",
    "StorageError",
    "rank_file",
    "estimate_bytes",
    "CHECKSUM",
]

# Fault drills: seconds to pause at a point of the save, so a test can kill a rank (or fill a disk) there.
DRILL: dict[str, float] = {"after_parts": 0.0, "before_write": 0.0}
# The checksum recorded per file (integrity.ALGO); None records sizes only (the benchmark's baseline).
CHECKSUM: str | None = integrity.ALGO
STALE_TEMP_S = 120.0  # a *.tmp-* folder older than this is a killed save's leftover
# The background writer's nice value (Linux: per thread): where training and the writer want the same
# core, training gets it; the writer runs in the time training waits on its collectives.
WRITER_NICE = 10
# While the writer runs, the interpreter hands the GIL over after this long instead of 5 ms: the
# training thread, back from a collective, waits for the writer's Python at most this long.
WRITER_SWITCH_S = 0.0005

_EXECUTOR: ThreadPoolExecutor | None = None
_PENDING: Future | None = None
_PG = None
_LOCK = threading.Lock()


class SaveError(RuntimeError):
    pass


class StorageError(SaveError):
    """The storage refused the save (no space, read-only, not shared); nothing of it was kept."""


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


def _agree_token(pg, token: int) -> int:
    t = torch.tensor([token], dtype=torch.int64)
    dist = _dist()
    if dist is not None:
        dist.broadcast(t, src=0, group=pg)
    return int(t.item())


_STAGE_CACHE: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # key -> (CPU buffer, what save writes)


def _stage(state: dict, prefix: str = "") -> dict:
    """Copy every tensor to CPU memory of its own (training may change the originals next step).

    Buffers are kept and reused by the next async save of the same shapes (the previous
    save has always finished by then: saves are serialized), and so is a DTensor's
    wrapper around its buffer: one copy per tensor, nothing allocated or wrapped again
    (``DTensor.from_local`` costs as much as the copy of a small tensor: benchmarks/FINDINGS.md).
    """
    with torch.no_grad():
        return _stage_dict(state, prefix)


def _stage_dict(state: dict, prefix: str) -> dict:
    out = {}
    for k, v in state.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out[k] = _stage_dict(v, key + ".")
        elif isinstance(v, torch.Tensor):
            out[k] = _stage_tensor(key, v)
        else:
            out[k] = v
    return out


def _stage_tensor(key: str, v: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    is_dt = isinstance(v, DTensor)
    local = _local(v) if is_dt else v
    cached = _STAGE_CACHE.get(key)
    if cached is not None and _fits(cached, v, local, is_dt):
        buf, out = cached
    else:
        buf = torch.empty(
            local.shape, dtype=local.dtype, device="cpu", pin_memory=local.is_cuda and torch.cuda.is_available()
        )
        out = buf
        if is_dt:
            out = DTensor.from_local(
                buf, v.device_mesh, v.placements, run_check=False, shape=v.shape, stride=v.stride()
            )
        _STAGE_CACHE[key] = (buf, out)
    buf.copy_(local, non_blocking=local.is_cuda)
    return out


def _local(v) -> torch.Tensor:
    """A DTensor's shard on this rank. ``to_local()`` is an autograd function, a cost per tensor
    on the blocking path; the shard itself is all staging and sizing read."""
    local = getattr(v, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else v.to_local()


def _fits(cached: tuple, v: torch.Tensor, local: torch.Tensor, is_dt: bool) -> bool:
    """The cached buffer (and wrapper) stage ``v``: same local shape and dtype, same global layout."""
    buf, out = cached
    if buf.shape != local.shape or buf.dtype != local.dtype or (out is not buf) != is_dt:
        return False
    if not is_dt:
        return True
    return (
        out.device_mesh is v.device_mesh
        and out.placements == v.placements
        and out.shape == v.shape
        and out.stride() == v.stride()
    )


def save(
    target: Target,
    root: str,
    *,
    tag: str | None = None,
    async_: bool = False,
    auto: bool = False,
    keep: int | None = None,
    with_optimizer: bool = True,
    report=None,
) -> dict:
    """Save ``target`` under ``root`` (collective: call on every rank).

    Returns ``{"name", "step", "blocked_s", ...}``; for ``async_`` the write continues in
    the background (``wait()`` returns its final result). ``keep``: retention of auto-saves.
    A storage fault raises :class:`StorageError` on every rank (the same message), the
    partial folder removed. With ``report`` (auto-save), ``report(info)`` is called once the
    save is done or failed (``info["failed"]`` the message) and a failure is not raised:
    training goes on.
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
    token = random.SystemRandom().getrandbits(47)
    made = _make_temp(root, os.path.join(root, catalog.temp_name(name, token))) if rank == 0 else None
    token = _agree_token(pg, token)  # after rank 0 made the folder: the others look for it next
    tmp = os.path.join(root, catalog.temp_name(name, token))
    try:
        msd, osd, frozen = capture_split(target, with_optimizer=with_optimizer)
        adapter = adapter_record(target.model) if frozen else {}
        if frozen:  # a peft model: its frozen base is written once per root, not with every save
            adapter["base"] = ensure_base(target.model, frozen, root, pg)
        otensors, ovalues = split_optimizer(osd)
        state = {"model": msd}
        if otensors:
            state["optim"] = otensors
        rank_info = {
            "rank": rank,
            "world_size": world,
            "step": target.state.step,
            "data": target.state.data,
            "rng": rng_state(),
        }
        _preflight(state, rank_info, root, tmp, name, made, pg, rank)
    except BaseException as exc:
        if rank == 0 and not isinstance(exc, StorageError):  # (a StorageError removed it already)
            shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(exc, StorageError) or report is None:
            raise
        info = {
            "name": name,
            "step": int(target.state.step),
            "failed": str(exc),
            "path": root,
            "blocked_s": time.perf_counter() - t0,
        }
        report(info)
        return info
    if async_:
        state = _stage(state)
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # the non-blocking device-to-host copies are done
    manifest = Manifest(
        name=name,
        tag=tag,
        step=int(target.state.step),
        time=0.0,
        world_size=world,
        strategy=target.strategy,
        spec=target.spec,
        mesh=target.mesh,
        loss=target.state.loss,
        data=dict(target.state.data or {}),
        auto=auto,
        async_save=async_,
        has_optimizer=bool(otensors),
        optimizer=type(getattr(target.optimizer, "optimizer", target.optimizer)).__name__
        if target.optimizer is not None
        else None,
        model_tensors=tensor_shapes(msd),
        optim_tensors=tensor_shapes(otensors),
        optim_values=ovalues,
        rank_files=[rank_file(r) for r in range(world)],
        torch_version=torch.__version__,
        model_config=model_config(target.model),
        adapter=adapter,
    )
    blocked = time.perf_counter() - t0

    def job() -> dict:
        try:
            info = _write_and_commit(state, root, tmp, name, manifest, pg, rank, keep, t0)
        except StorageError as exc:
            if report is None:
                raise
            info = {"name": name, "step": manifest.step, "failed": str(exc), "path": root}
        if report is not None:
            report(info)
        return info

    if not async_:
        info = job()
        info["blocked_s"] = time.perf_counter() - t0
        return info
    with _LOCK:
        if _EXECUTOR is None:
            _EXECUTOR = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="workbench-ckpt", initializer=_lower_writer_priority
            )
        _PENDING = _EXECUTOR.submit(_short_switches, job)
    return {"name": name, "step": manifest.step, "async": True, "blocked_s": blocked, "path": os.path.join(root, name)}


def _short_switches(job):
    """Run ``job`` (the background write) with the shorter GIL switch interval, then restore it."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, WRITER_SWITCH_S))
    try:
        return job()
    finally:
        sys.setswitchinterval(before)


def _lower_writer_priority() -> None:
    """Runs on the writer thread once: lowers that thread's priority only (a thread id is a
    process id to ``setpriority`` on Linux); elsewhere it keeps its priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
    except (AttributeError, OSError):  # not Linux, or not allowed: the writer runs at training's priority
        pass


def _cause(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        what = errno.errorcode.get(exc.errno, "") if exc.errno else ""
        return f"{exc.strerror or exc} ({what})" if what else str(exc)
    return f"{type(exc).__name__}: {exc}"


def _make_temp(root: str, tmp: str) -> str | None:
    """Rank 0: the save's folder (and ``root``); the error text where that fails."""
    try:
        os.makedirs(root, exist_ok=True)
        os.mkdir(tmp)
    except OSError as exc:
        return f"rank 0 cannot create {exc.filename or tmp}: {_cause(exc)}"
    return None


def _sizes(state: dict) -> tuple[int, int, int]:
    """(bytes of plain tensors, a hash of their names, bytes of this rank's DTensor shards)."""
    from torch.distributed.tensor import DTensor

    plain, shards, names = 0, 0, []

    def walk(d, prefix=""):
        nonlocal plain, shards
        for k, v in d.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")
            elif isinstance(v, DTensor):
                t = _local(v)
                shards += t.numel() * t.element_size()
            elif isinstance(v, torch.Tensor):
                plain += v.numel() * v.element_size()
                names.append(f"{prefix}{k}")

    walk(state)
    return plain, zlib.crc32("\n".join(sorted(names)).encode()), shards  # str hash() differs per process


def estimate_bytes(reports: list[dict]) -> int:
    """The checkpoint's size from every rank's tensors: replicated tensors (same names on several
    ranks, as under DDP) are written once, shards and pipeline stages add up; plus DCP's framing."""
    by_names: dict[int, int] = {}
    for r in reports:
        by_names[r["names"]] = max(by_names.get(r["names"], 0), r["plain"])
    tensors = sum(by_names.values()) + sum(r["shards"] for r in reports)
    return int(tensors * 1.02) + 64 * 1024 * len(reports)


def _preflight(state, rank_info, root, tmp, name, made, pg, rank) -> None:
    """Before any shard is written: every rank sees rank 0's folder (a folder shared by all
    ranks), can write into it (its rank file, a few KB), and the estimated size fits the
    free space. Any failure raises the same :class:`StorageError` on every rank."""
    err = made
    if err is None and not os.path.isdir(tmp):
        err = (
            f"rank {rank} does not see the folder rank 0 just made ({tmp}): {root} is not shared by all "
            "ranks; checkpoints need one folder every rank can reach (a shared filesystem): `--dir PATH`"
        )
    if err is None:
        try:
            with open(os.path.join(tmp, rank_file(rank)), "w", encoding="utf-8") as fh:
                # one C-encoded string, not json.dump's chunk-by-chunk writes of ~1250 RNG ints
                # on the blocking path; fsynced by the write, off the training thread
                fh.write(json.dumps(rank_info))
        except OSError as exc:
            err = f"rank {rank} cannot write {exc.filename or tmp}: {_cause(exc)}"
    free = None
    if err is None:
        try:
            free = shutil.disk_usage(tmp).free
        except OSError as exc:
            err = f"rank {rank} cannot read the free space of {root}: {_cause(exc)}"
    plain, names, shards = _sizes(state)
    mine = {"rank": rank, "err": err, "free": free, "plain": plain, "names": names, "shards": shards}
    reports = _gather_reports(mine, pg)
    errors = [r["err"] for r in reports if r["err"]]
    need = estimate_bytes(reports)
    if not errors:
        for r in reports:
            if r["free"] is not None and r["free"] < need:
                errors.append(
                    f"it needs about {need / 2**20:,.2f} MiB but {root} has {r['free'] / 2**20:,.2f} MiB "
                    f"free (seen by rank {r['rank']}): refused before writing; free some space "
                    "(`%distrain ckpt delete ...`) or save elsewhere (`--dir PATH`)"
                )
                break
    if errors:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise StorageError(_failure_text(name, root, errors[0]))


def _failure_text(name: str, root: str, cause: str) -> str:
    try:
        found = catalog.entries(root)
    except OSError:
        found = []
    latest = os.path.basename(found[-1][0]) if found else None
    return f"checkpoint {name!r} was not saved: {cause}. Nothing of it was left in {root}; `latest` is " + (
        f"still {latest}" if latest else "unchanged (there is none)"
    )


REPORT_BYTES = 4096  # a preflight report as JSON: ~100 bytes, plus the cause of a failure


def _gather_reports(mine: dict, pg) -> list[dict]:
    """Every rank's preflight report in one fixed-size all-gather: it is on the blocking
    path of an async save, and ``all_gather_object`` takes two collectives (sizes, then
    data), each a wait for the last rank to be scheduled when ranks outnumber cores."""
    dist = _dist()
    if dist is None:
        return [mine]
    blob, keep = json.dumps(mine).encode(), REPORT_BYTES // 2
    while len(blob) > REPORT_BYTES:  # only a very long cause: keep its start
        blob, keep = json.dumps(dict(mine, err=mine["err"][:keep] + " ...")).encode(), keep // 2
    buf = torch.zeros(REPORT_BYTES, dtype=torch.uint8)
    buf[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
    out = [torch.empty_like(buf) for _ in range(dist.get_world_size(pg))]
    dist.all_gather(out, buf, group=pg)
    # JSON escapes control characters, so the first zero byte ends a report
    return [json.loads(bytes(t.numpy()).split(b"\0", 1)[0]) for t in out]


def _all_gather(obj, pg) -> list:
    dist = _dist()
    if dist is None:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj, group=pg)
    return out


def _dcp_failure(exc, verb: str = "write") -> str:
    """The first rank's cause from DCP's ``CheckpointException`` (rank -> (exception, traceback))."""
    for r, pair in sorted(exc.failures.items()):
        e = pair[0] if isinstance(pair, tuple) else pair
        if isinstance(e, OSError):
            return f"rank {r} could not {verb} {e.filename or 'its part'}: {_cause(e)}"
        return f"rank {r}: {_cause(e)}"
    return str(exc)


def _planner(staged: bool = False):
    """DCP's default planner with its plan cache: when no rank's list of tensors changed since the
    last save (every auto-save of a run), the ranks send rank 0 an empty plan instead of theirs and
    rank 0 reuses the global plan and metadata (a class of our own: its own cache in DCP).

    ``staged``: the state holds this module's staging buffers (an async save). Those are the same
    objects from save to save while their shapes hold, so when every one of them is the object
    the cached plan was made from, this rank's local plan is that plan, and building it again
    (one write item per tensor, in the writer's Python) is skipped.
    """
    global _PLANNER_CLS
    if _PLANNER_CLS is None:
        from torch.distributed.checkpoint import DefaultSavePlanner, SavePlan, SavePlanner

        class WorkbenchSavePlanner(DefaultSavePlanner):
            planned_for: tuple | None = None  # the staged tensors DCP's cached local plan was made from

            def __init__(self, staged: bool):
                super().__init__(enable_plan_caching=True)
                self._staged = staged

            def create_local_plan(self):
                key = self._objects() if self._staged else None
                cached = SavePlanner._cached_save_plan.get(self._cached_plans_key)
                if key is not None and _same_objects(key, type(self).planned_for) and cached is not None:
                    self.plan = cached
                    return SavePlan([], usable=False)
                type(self).planned_for = None  # until this plan is in DCP's cache (finish_plan)
                self._new_key = key
                return super().create_local_plan()

            def finish_plan(self, new_plan):
                out = super().finish_plan(new_plan)
                if hasattr(self, "_new_key"):
                    type(self).planned_for = self._new_key
                return out

            def _objects(self) -> tuple | None:
                """(this rank's role, every name and a weak reference to its staged tensor); None
                where a value is not a tensor (a plan for it could differ with its value). Weak
                references, not ids: a freed buffer's id can come back as a tensor of other shapes."""
                items = []
                for k, v in self.state_dict.items():
                    if not isinstance(v, torch.Tensor):
                        return None
                    items.append((k, weakref.ref(v)))
                return (self.is_coordinator, tuple(items))

        _PLANNER_CLS = WorkbenchSavePlanner
    return _PLANNER_CLS(staged)


_PLANNER_CLS = None


def _same_objects(key: tuple, planned: tuple | None) -> bool:
    """Whether ``key`` names the very tensors, under the same names and role, that ``planned`` did."""
    if planned is None or key[0] != planned[0] or len(key[1]) != len(planned[1]):
        return False
    return all(k == pk and r() is not None and r() is pr() for (k, r), (pk, pr) in zip(key[1], planned[1]))


def _write_and_commit(state, root, tmp, name, manifest: Manifest, pg, rank, keep, t0) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    dist = _dist()
    if rank == 0:  # leftovers of saves killed earlier (not younger ones: another notebook may share root)
        catalog.clean_temp(root, older_than=STALE_TEMP_S, keep=tmp)
    if DRILL.get("before_write"):
        time.sleep(DRILL["before_write"])
    err, records = None, {}
    writer = shard_writer.writer(tmp)
    try:
        with _quiet_single_process():
            dcp.save(
                state,
                storage_writer=writer,
                planner=_planner(manifest.async_save),
                process_group=pg,
                no_dist=dist is None,
            )
    except CheckpointException as exc:  # raised alike on every rank
        err = _dcp_failure(exc)
    except Exception as exc:  # noqa: BLE001 - told to every rank below
        err = f"rank {rank}: {_cause(exc)}"
    if err is None:
        try:  # this rank's files (rank 0: also DCP's .metadata), read back while in the page cache
            with open(os.path.join(tmp, rank_file(rank)), "rb") as fh:
                os.fsync(fh.fileno())
            mine = [n for n in os.listdir(tmp) if n.startswith(f"__{rank}_")] + [rank_file(rank)]
            mine += [".metadata"] if rank == 0 else []
            records = {n: integrity.record(os.path.join(tmp, n), CHECKSUM) for n in mine}
        except OSError as exc:
            err = f"rank {rank} cannot read back {exc.filename or tmp}: {_cause(exc)}"
    if DRILL.get("after_parts"):
        time.sleep(DRILL["after_parts"])
    reports = _all_gather((err, records), pg)  # every rank's part and rank file are on disk (or not)
    errors = [e for e, _ in reports if e]
    final = os.path.join(root, name)
    msg = None
    if errors:
        msg = _failure_text(name, root, errors[0])
    elif rank == 0:
        try:
            _commit(tmp, final, manifest, {k: v for _, rec in reports for k, v in rec.items()}, t0)
        except Exception as exc:  # noqa: BLE001 - told to every rank below
            msg = _failure_text(name, root, f"rank 0 could not commit it: {_cause(exc)}")
    if rank == 0 and msg:
        shutil.rmtree(tmp, ignore_errors=True)
    if dist is not None:
        box = [msg]
        dist.broadcast_object_list(box, src=0, group=pg)
        msg = box[0]
    if msg:
        raise StorageError(msg)
    info = {
        "name": name,
        "step": manifest.step,
        "path": final,
        "async": manifest.async_save,
        "save_s": time.perf_counter() - t0,
    }
    if rank == 0 and keep:
        try:
            info["removed"] = catalog.apply_retention(root, keep, protect=final)
        except OSError as exc:
            info["retention_error"] = f"retention could not delete an old auto-save: {_cause(exc)}"
    return info


def _commit(tmp: str, final: str, manifest: Manifest, records: dict, t0: float) -> None:
    """Rank 0: check every file is there, write the manifest (sizes, checksums), rename into place."""
    missing = [f for f in manifest.rank_files if f not in records]
    if missing or ".metadata" not in records:
        raise SaveError(f"checkpoint {manifest.name!r} is incomplete (missing {missing or ['.metadata']})")
    for n in os.listdir(tmp):  # a part written by no rank's record (DCP's naming changed?): sizes at least
        if n not in records and os.path.isfile(os.path.join(tmp, n)):
            records[n] = integrity.record(os.path.join(tmp, n), CHECKSUM)
    manifest.integrity = {k: records[k] for k in sorted(records)}
    manifest.files = {k: v[0] for k, v in manifest.integrity.items()}
    manifest.bytes = sum(manifest.files.values())
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
        shutil.rmtree(old, ignore_errors=True)
