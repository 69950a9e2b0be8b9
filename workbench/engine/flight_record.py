"""This rank's collective flight record: what it entered, on which group, with what, and when.

As torch's NCCL flight recorder keeps for NCCL, for gloo and nccl alike: each collective the
rank calls through ``torch.distributed`` (``comm_timing``'s wrappers) gets a sequence number on
its group, and its op, payload and enter/leave times go into a memory-mapped file of
``shared.flight``'s layout in the rank set's folder. A record is a few field writes into that
memory, no system call; the file is read by the notebook when a cell or step hangs."""

from __future__ import annotations

import mmap
import os
import threading
import time
import weakref
from contextlib import contextmanager

from ..shared import flight

_LOCK = threading.Lock()
_STATE: dict = {}  # "mm": the mapped file, "written": records begun (also in the header)
_GROUPS: dict[int, list] = {}  # id(process group) -> [weakref to it, label, calls so far]


def install(folder: str, rank: int) -> str:
    """Start this process's record in ``folder`` (a fresh file: a restarted rank starts at 0)."""
    os.makedirs(folder, exist_ok=True)
    file = flight.path(folder, rank)
    with open(file, "wb") as fh:
        fh.write(b"\0" * flight.FILE_SIZE)
    with open(file, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), flight.FILE_SIZE)
    flight.HEADER.pack_into(mm, 0, flight.MAGIC, flight.VERSION, flight.SLOTS, rank, os.getpid(), 0)
    with _LOCK:
        _STATE.update(mm=mm, written=0)
    return file


def installed() -> bool:
    return "mm" in _STATE


@contextmanager
def paused(pause: bool = True):
    """No record kept while inside (``pause``): what the record costs is measured against this
    (benchmarks/flight_record_bench.py)."""
    mm = _STATE.pop("mm", None) if pause else None
    try:
        yield
    finally:
        if mm is not None:
            _STATE["mm"] = mm


def forget_groups() -> None:
    """A new default group (``runtime.rejoin_group``): its collectives count from 1 again."""
    with _LOCK:
        _GROUPS.clear()


def _group(group) -> list:
    """[ref, label as bytes, count] of ``group`` (None: the default group)."""
    c10d = _C10D[0] if _C10D else _c10d()
    pg = c10d._world.default_pg if group is None else group
    entry = _GROUPS.get(id(pg))
    if entry is None or entry[0]() is not pg:
        if pg is None:
            raise RuntimeError("no process group")
        if pg is c10d._world.default_pg:
            label = "world"
        else:
            label = flight.group_label(c10d.get_process_group_ranks(pg))
            if len(label) > 32:  # too long to keep whole: a reader must not parse a cut list
                label = label[:31] + "+"
        entry = [weakref.ref(pg), flight.clip(label, 32), 0]
        _GROUPS[id(pg)] = entry
    return entry


_C10D: list = []
_TEXT: dict = {}  # op names, dtypes and shapes -> their bytes in the record (met again and again)


def _c10d():
    from torch.distributed import distributed_c10d

    _C10D.append(distributed_c10d)
    return distributed_c10d


def _bytes(value, size: int) -> bytes:
    raw = _TEXT.get(value)
    if raw is None:
        if len(_TEXT) > 1024:  # shapes of a long run: kept to the recent ones
            _TEXT.clear()
        text = value if isinstance(value, str) else str(value).removeprefix("torch.")
        raw = _TEXT[value] = flight.clip(text, size)
    return raw


def _shape(shape) -> bytes:
    raw = _TEXT.get(shape)
    if raw is None:
        raw = _bytes(",".join(map(str, shape)), 16)
        _TEXT[shape] = raw
    return raw


def _describe(payload, how: str) -> tuple[bytes, bytes, int]:
    """(dtype, shape, elements) of a collective's payload."""
    if how == "none" or payload is None:
        return b"", b"", 0
    if how == "list":
        if not len(payload):
            return b"", b"0*", 0
        first = payload[0]
        shape = f"{len(payload)}*" + ",".join(map(str, first.shape))
        return _bytes(first.dtype, 16), flight.clip(shape, 16), sum(t.numel() for t in payload)
    return _bytes(payload.dtype, 16), _shape(payload.shape), payload.numel()


def enter(
    op: str,
    group,
    payload,
    how: str,
    nbytes: int,
    *,
    peer: int = -1,
    is_async: bool = False,
    own: bool = False,
    on_device: bool = False,
) -> int:
    """Record that this rank entered ``op``; returns the slot to pass to :func:`leave` (-1: none)."""
    mm = _STATE.get("mm")
    if mm is None:
        return -1
    try:
        dtype, shape, numel = _describe(payload, how)
    except Exception:  # an unusual argument: the call is still recorded
        dtype, shape, numel = b"?", b"?", 0
    flags = (flight.ASYNC if is_async else 0) | (flight.WORKBENCH if own else 0) | (flight.DEVICE if on_device else 0)
    with _LOCK:
        try:
            entry = _group(group)
        except Exception:  # no process group (yet): nothing to number it on
            return -1
        if op in flight.P2P_OPS:
            seq = 0  # point-to-point calls are not matched across the group
        else:
            entry[2] += 1
            seq = entry[2]
        n = _STATE["written"]
        flight.RECORD.pack_into(
            mm,
            flight.HEADER_SIZE + (n % flight.SLOTS) * flight.RECORD.size,
            seq,
            time.time(),
            0.0,
            nbytes,
            numel,
            _bytes(op, 16),
            entry[1],
            dtype,
            shape,
            peer,
            flags,
        )
        _STATE["written"] = n + 1
        flight.COUNT.pack_into(mm, flight.COUNT_OFFSET, n + 1)
    return n


def leave(n: int) -> None:
    """The call recorded as ``n`` returned (its slot is left alone once a newer call took it)."""
    mm = _STATE.get("mm")
    if mm is None or n < 0 or _STATE["written"] - n > flight.SLOTS:
        return
    flight.LEFT.pack_into(
        mm, flight.HEADER_SIZE + (n % flight.SLOTS) * flight.RECORD.size + flight.LEFT_OFFSET, time.time()
    )


def records() -> list[flight.Record]:
    """This rank's records, oldest first (tests; the notebook reads the file)."""
    mm = _STATE.get("mm")
    if mm is None:
        return []
    decoded = flight.decode(bytes(mm))
    return [] if decoded is None else decoded[2]
