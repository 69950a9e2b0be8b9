"""How the ranks of a training run agree, each step, on what to do next and on the loss.

A pause that reached rank 0 before rank 1 must still stop both at the same step, or the
step's collectives would mismatch and hang: each rank posts its :class:`Flags` with its loss
and every rank acts on the maximum. The rows go through a shared-memory :class:`Board` where
every rank is on this host (cheaper than a gloo collective: benchmarks/FINDINGS.md), else
through a private gloo group, which keeps the default group free for cells while paused."""

from __future__ import annotations

import mmap
import os
import struct
import tempfile
import time
import uuid
import zlib
from typing import NamedTuple

import torch

from . import comm_timing

WIDTH = 8  # values a rank posts: the loss and up to 7 flags
SLOTS = 4  # a rank is at most one agreement ahead of the slowest: 2 would do
_HEAD = 2  # generation, number
_ROW = _HEAD + WIDTH + 1  # ... and a CRC of the rest
TIMEOUT_S = 1800.0  # gloo's default collective timeout: a peer that never comes is an error


class Flags(NamedTuple):
    """What the ranks agree on each step (each the maximum over the ranks)."""

    stop: int = 0  # end the run
    pause: int = 0  # pause before the next step
    version: int = 0  # highest committed change version (:mod:`.staging`)
    reason: int = 0  # why it pauses (a key of the trainer's REASONS)
    hooks_due: int = 0  # a step hook that may pause runs after this step on some rank


class Board:
    """Every rank's latest rows in one shared-memory file: each posts its row of agreement
    ``n``, then reads everyone's.

    Rows are float64 ``[generation, n, *values, crc32]`` in slot ``n % SLOTS`` of the
    rank's own area; only the rank writes there. A header holds each rank's pid: a rank
    that waits for a peer which is gone (killed, out of memory) says so within a second,
    as a gloo collective would fail on the closed connection, instead of waiting on. A reader accepts a row when generation
    and number are those it waits for and the CRC matches, so a row read half-written (or
    seen out of order on a CPU with a weak memory model) is read again rather than
    trusted. The generation is per trainer, so rows a previous trainer left are never
    taken for this one's.
    """

    def __init__(self, path: str, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size
        fd = os.open(path, os.O_RDWR)
        try:
            self._mm = mmap.mmap(fd, _size(world_size))
        finally:
            os.close(fd)
        self._mm[rank * 8 : rank * 8 + 8] = struct.pack("d", os.getpid())

    @staticmethod
    def create(world_size: int) -> str:
        """Make the zeroed file (rank 0); the others open it by path."""
        folder = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        path = os.path.join(folder, f"workbench-agreement-{uuid.uuid4().hex}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, _size(world_size))
        finally:
            os.close(fd)
        return path

    def _offset(self, rank: int, n: int) -> int:
        return (self.world_size + ((rank * SLOTS) + n % SLOTS) * _ROW) * 8

    def gone(self, rank: int) -> int | None:
        """The pid of ``rank`` when that process no longer exists, else None."""
        pid = int(struct.unpack("d", self._mm[rank * 8 : rank * 8 + 8])[0])
        if pid <= 0:
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        return None

    def post(self, generation: int, n: int, values) -> None:
        body = struct.pack(f"{_HEAD + WIDTH}d", generation, n, *_padded(values))
        off = self._offset(self.rank, n)
        self._mm[off : off + len(body) + 8] = body + struct.pack("d", zlib.crc32(body))

    def _read(self, rank: int, generation: int, n: int):
        off = self._offset(rank, n)
        raw = self._mm[off : off + _ROW * 8]
        row = struct.unpack(f"{_ROW}d", raw)
        if row[0] != generation or row[1] != n or row[-1] != zlib.crc32(raw[:-8]):
            return None
        return row[_HEAD : _HEAD + WIDTH]

    def collect(self, generation: int, n: int, timeout: float = TIMEOUT_S) -> list:
        """Every rank's values of agreement ``n``, in rank order (waits for the late ones)."""
        rows: list = [None] * self.world_size
        missing = list(range(self.world_size))
        spins, started, checked = 0, None, 0.0
        while True:
            for q in missing:
                rows[q] = self._read(q, generation, n)
            missing = [q for q in missing if rows[q] is None]
            if not missing:
                return rows
            spins += 1
            now = time.monotonic()
            if started is None:
                started = now
            elif now - checked > 1.0:
                checked = now
                gone = {q: pid for q in missing if (pid := self.gone(q)) is not None}
                if gone:
                    raise RuntimeError(
                        f"rank {self.rank}: "
                        + ", ".join(f"rank {q} (pid {pid})" for q, pid in gone.items())
                        + f" is gone: agreement {n} of the training run cannot complete"
                    )
                if now - started > timeout:
                    raise RuntimeError(
                        f"rank {self.rank}: rank(s) {missing} did not reach agreement {n} of the "
                        f"training run in {timeout:.0f} s (stuck in a step)"
                    )
            time.sleep(0 if spins < 20 else min(0.001, 5e-5 * spins))

    def close(self) -> None:
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass


def _size(world_size: int) -> int:
    return (world_size + world_size * SLOTS * _ROW) * 8


def _padded(values) -> list[float]:
    values = [float(v) for v in values]
    if len(values) > WIDTH:
        raise ValueError(f"an agreement row holds at most {WIDTH} values, got {len(values)}")
    return values + [0.0] * (WIDTH - len(values))


class Channel:
    """What a process's trainers agree through: the board where every rank could open it,
    else a private gloo group; ``group`` is the CPU group for the trainers' one-off calls
    (the run id), which is also the agreement's group when there is no board."""

    def __init__(self, group, board: Board | None):
        self.group, self.board = group, board

    @property
    def transport(self) -> str:
        return "shared memory" if self.board is not None else "gloo"


_CHANNELS: dict = {}  # id of the default group -> its Channel
_GLOO: dict = {}  # id of the default group -> its private gloo Channel


def channel() -> Channel:
    """This process's agreement channel, made once per process group on every rank at once
    (as a trainer is built everywhere): a gloo group per trainer would keep 3 threads and
    their sockets alive for each ``train start --gpt`` of a session.

    Where the default group is gloo and the board works, no group is made: the board is
    set up, and the run ids broadcast, through the default group while the trainer is
    built (no run is in flight then, as with the strategies' own set-up). Each gloo group
    keeps a thread that wakes every 10 ms, on the cores the ranks train on.
    """
    import torch.distributed as dist

    world = dist.group.WORLD
    found = _CHANNELS.get(id(world))
    if found is None:
        _forget_other_groups(world)
        rank, size = dist.get_rank(), dist.get_world_size()
        # every rank takes the same branch: the default group's backend and the board's
        # outcome (agreed by all-reduce) are the same everywhere
        if dist.get_backend() == "gloo":
            board = _open_board(world, rank, size)
            found = Channel(world, board) if board is not None else gloo_channel()
        else:
            gloo = gloo_channel()
            board = _open_board(gloo.group, rank, size)
            found = Channel(gloo.group, board) if board is not None else gloo
        _CHANNELS[id(world)] = found
    return found


def gloo_channel() -> Channel:
    """A channel through a private gloo group, no board: for ranks on several hosts and the
    fallback (its all-gather runs while DDP's buckets use the default group). Made once per
    process group, on every rank at once."""
    import torch.distributed as dist

    world = dist.group.WORLD
    found = _GLOO.get(id(world))
    if found is None:
        _forget_other_groups(world)
        found = _GLOO[id(world)] = Channel(dist.new_group(backend="gloo"), None)
    return found


def _forget_other_groups(world) -> None:
    """Channels of an earlier default group are gone with it (a restarted process group)."""
    for cache in (_CHANNELS, _GLOO):
        for key in [k for k in cache if k != id(world)]:
            old = cache.pop(key)
            if old.board is not None:
                old.board.close()


def _open_board(group, rank: int, world_size: int) -> Board | None:
    """Rank 0 makes the file; every rank tries to open it; the board is used only if all
    could (ranks on another host cannot), and the file is unlinked once all have it open."""
    import torch.distributed as dist

    path = [None]
    if rank == 0:
        try:
            path[0] = Board.create(world_size)
        except OSError:
            path[0] = ""
    dist.broadcast_object_list(path, src=0, group=group)
    board = None
    if path[0]:
        try:
            board = Board(path[0], rank, world_size)
        except OSError:
            board = None
    ok = torch.tensor([1 if board is not None else 0], dtype=torch.int64)
    comm_timing.original("all_reduce")(ok, op=dist.ReduceOp.MIN, group=group)
    if rank == 0 and path[0]:
        os.unlink(path[0])  # open everywhere (or given up): nothing is left behind in /dev/shm
    if not ok.item() and board is not None:
        board.close()
        board = None
    return board


class Agreement:
    def __init__(self, channel: Channel | None, generation: int = 0, loss_group=None, world_size: int = 1):
        """``channel``: the process's (None at world size 1); ``generation``: the same number on
        every rank, new for each trainer; ``loss_group``: the ranks whose losses are averaged
        (None: all)."""
        import torch.distributed as dist

        self.group = channel.group if channel is not None else None
        self.board = channel.board if channel is not None else None
        self.transport = channel.transport if channel is not None else "none"
        self.generation = generation
        self.world_size = world_size
        self._n = 0
        if self.group is None:
            self._loss_rows = None
        elif loss_group is None or loss_group is dist.group.WORLD:
            self._loss_rows = list(range(world_size))
        else:
            self._loss_rows = sorted(dist.get_process_group_ranks(loss_group))

    def flags(self, local: Flags) -> tuple[Flags, float]:
        """The agreed flags (max over ranks) and the seconds it took."""
        t0 = time.perf_counter()
        if self.group is None:
            return Flags(*local), 0.0
        if self.board is not None:
            flags, _ = Pending(self, [0.0, *local]).table()
            return flags, time.perf_counter() - t0
        t = torch.tensor(local, dtype=torch.int64)
        comm_timing.original("all_reduce")(t, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return Flags(*t.tolist()), time.perf_counter() - t0

    def with_loss(self, local: Flags, loss: float) -> Pending:
        """Start agreeing on ``local`` flags and ``loss``; ``.result()`` gives the agreed
        flags, the loss averaged over this rank's loss group and the seconds it waited.

        Started as soon as the loss is known (before backward), it completes while backward
        runs: the step waits for it only if some rank is that far behind. A non-finite
        loss on any rank of the group makes the mean non-finite.
        """
        return Pending(self, [loss, *local])


class Pending:
    """An agreement under way (see :meth:`Agreement.with_loss`): posted, not yet collected."""

    def __init__(self, agreement: Agreement, row: list):
        self._agreement, self._row = agreement, row
        self._work = self._rows = None
        a = agreement
        if a.group is None:
            return
        a._n += 1
        self._n = a._n
        if a.board is not None:
            a.board.post(a.generation, self._n, row)
        else:
            t = torch.tensor(_padded(row), dtype=torch.float64)
            self._rows = [torch.empty_like(t) for _ in range(a.world_size)]
            self._work = comm_timing.original("all_gather")(self._rows, t, group=a.group, async_op=True)

    def table(self) -> tuple[Flags, list[list[float]]]:
        """The agreed flags and every rank's row."""
        a = self._agreement
        if a.group is None:
            rows = [self._row]
        elif a.board is not None:
            rows = a.board.collect(a.generation, self._n)
        else:
            self._work.wait()
            rows = [r.tolist() for r in self._rows]
        width = len(self._row) - 1
        flags = Flags(*(int(max(r[1 + i] for r in rows)) for i in range(width)))
        return flags, rows

    def result(self) -> tuple[Flags, float, float]:
        t0 = time.perf_counter()
        flags, rows = self.table()
        picked = [rows[i] for i in self._agreement._loss_rows] if self._agreement._loss_rows else rows
        loss = sum(r[0] for r in picked) / len(picked)
        return flags, loss, time.perf_counter() - t0
