"""The collective flight record's file: a small ring of the collectives one rank entered.

Written by the rank (:mod:`workbench.engine.flight_record`), read without its help by the
notebook and the Lab server, so a rank blocked in C inside a collective still answers. A
header, then ``SLOTS`` fixed-size records; the writer fills a record, then counts it in the
header, so a reader never takes a half-written one for whole. Pure: no torch.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from .ranges import format_ranks

MAGIC = b"WBFR"
VERSION = 1
SLOTS = 64
# magic, version, slots, rank, pid, records ever begun
HEADER = struct.Struct("<4sHHiiq")
HEADER_SIZE = 64
# seq, entered, left (0: still inside), bytes, elements, op, group, dtype, shape, peer, flags
RECORD = struct.Struct("<qddqq16s32s16s16sii")
COUNT = struct.Struct("<q")  # the header's "records ever begun", rewritten alone after each record
COUNT_OFFSET = 16
LEFT = struct.Struct("<d")  # a record's "left", rewritten alone when the call returns
LEFT_OFFSET = 16  # where ``left`` sits in a record (seq and entered come before it)
FILE_SIZE = HEADER_SIZE + SLOTS * RECORD.size

ASYNC = 1  # flags: the call returned a Work (async_op, isend/irecv): "left" is its launch
WORKBENCH = 2  # flags: the workbench's own collective (the trainer's step agreement, ...)
DEVICE = 4  # flags: on device tensors (nccl): the call returns once launched, the device runs it
P2P_OPS = ("send", "recv", "isend", "irecv")
# the functions that run the same collective (what "the same op" means across ranks)
KINDS = {
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "all_to_all_single": "all_to_all",
}
SIZED = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")  # every rank passes the same size


@dataclass(frozen=True)
class Record:
    """One collective call on one rank (``seq`` counts the calls on its group from 1)."""

    seq: int
    op: str
    group: str  # "world", or "ranks 0-1" for a subgroup
    dtype: str
    shape: str
    nbytes: int
    numel: int
    entered: float  # time.time() when the call began
    left: float  # when it returned; 0.0 while the rank is still inside it
    peer: int = -1  # the other rank of a send/recv
    flags: int = 0

    @property
    def inside(self) -> bool:
        return self.left == 0.0

    @property
    def p2p(self) -> bool:
        return self.op in P2P_OPS

    @property
    def kind(self) -> str:
        return KINDS.get(self.op, self.op)

    @property
    def launched_only(self) -> bool:
        """Its "left" says it was handed to the device or a Work, not that it completed."""
        return bool(self.flags & (ASYNC | DEVICE))

    def payload(self) -> str:
        """``float32[4,1024]``, ``4 x float32[1024]`` for a list of tensors, ``-`` for a barrier."""
        if not self.dtype:
            return "-"
        count, star, shape = self.shape.partition("*")
        return f"{count} x {self.dtype}[{shape}]" if star else f"{self.dtype}[{self.shape}]"


def group_label(ranks: list[int]) -> str:
    """``ranks 0-3,6``: a subgroup by its members (the world group is ``world``)."""
    return "ranks " + format_ranks(ranks)


def members(label: str) -> list[int] | None:
    """The ranks of a ``group_label`` (None for ``world`` or a label cut short)."""
    if not label.startswith("ranks "):
        return None
    out: list[int] = []
    try:
        for part in label[6:].split(","):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        return None
    return out


def path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank{rank}.flight")


def _text(raw: bytes) -> str:
    return raw.rstrip(b"\0").decode("utf-8", "replace")


def clip(text: str, size: int) -> bytes:
    """``text`` as at most ``size`` UTF-8 bytes (cut on a character boundary)."""
    raw = text.encode("utf-8")
    if len(raw) <= size:
        return raw
    return raw[:size].decode("utf-8", "ignore").encode("utf-8")


def decode(data: bytes) -> tuple[int, int, list[Record]] | None:
    """(rank, pid, records oldest first) from a file's bytes; None when it is not a flight record."""
    if len(data) < HEADER_SIZE:
        return None
    magic, version, slots, rank, pid, written = HEADER.unpack_from(data, 0)
    if magic != MAGIC or version != VERSION or len(data) < HEADER_SIZE + slots * RECORD.size:
        return None
    # the oldest slot may be the one being rewritten right now: it is left out
    first = max(0, written - slots + 1)
    records = []
    for i in range(first, written):
        seq, entered, left, nbytes, numel, op, group, dtype, shape, peer, flags = RECORD.unpack_from(
            data, HEADER_SIZE + (i % slots) * RECORD.size
        )
        records.append(
            Record(seq, _text(op), _text(group), _text(dtype), _text(shape), nbytes, numel, entered, left, peer, flags)
        )
    return rank, pid, records


def read(folder: str, rank: int) -> list[Record] | None:
    """The records of ``rank`` in ``folder``, oldest first; None where the rank keeps no record."""
    try:
        with open(path(folder, rank), "rb") as fh:
            data = fh.read(FILE_SIZE)
    except OSError:
        return None
    decoded = decode(data)
    return None if decoded is None else decoded[2]
