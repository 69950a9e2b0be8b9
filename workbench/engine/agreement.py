"""How the ranks of a training run agree, each step, on what to do next and on the loss.

Why agree at all: a pause that reached rank 0 before rank 1 must still stop both at the
same step (DDP/FSDP collectives would otherwise mismatch and hang). Each rank holds
flags ``[stop, pause, set_version, reason]``; the ranks act on their maximum, so a
request from ANY rank wins everywhere (a step hook on one rank can pause the whole run).

Why in one collective with the loss: the trainer also needs the loss averaged over the
data-parallel ranks before its optimizer step (every rank must decide the same about a
non-finite loss). Done apart, the two were two extra synchronisation points per step:
measured 2.3-3.1 ms and ~1.7 ms of a ~55 ms step on 2 CPU ranks, a 20% slower step than
the same loop without them. :meth:`Agreement.with_loss` is one all-gather of
``[loss, *flags]`` per step, started when the loss is known and waited for before the
optimizer step, so it runs during backward: each rank takes the flags' maximum over all
rows and the mean loss over the rows of its own loss group.

Both run on a private gloo group, so the default group stays free while a run is
paused (a cell, a checkpoint save, may use it then), and through the unwrapped
collectives, so they do not show in the run's collective telemetry.
"""
from __future__ import annotations

import time

import torch

from . import comm_timing


class Agreement:
    def __init__(self, group, loss_group=None, world_size: int = 1):
        """``group``: a group of every rank (None at world size 1); ``loss_group``: the
        ranks whose losses are averaged (None: all)."""
        import torch.distributed as dist

        self.group = group
        self.world_size = world_size
        if group is None:
            self._loss_rows = None
        elif loss_group is None or loss_group is dist.group.WORLD:
            self._loss_rows = list(range(world_size))
        else:
            self._loss_rows = sorted(dist.get_process_group_ranks(loss_group))

    def flags(self, local: list[int]) -> tuple[list[int], float]:
        """The agreed flags (max over ranks) and the seconds it took."""
        t0 = time.perf_counter()
        if self.group is None:
            return list(local), 0.0
        t = torch.tensor(local, dtype=torch.int64)
        comm_timing.ORIGINAL["all_reduce"](t, op=torch.distributed.ReduceOp.MAX, group=self.group)
        return t.tolist(), time.perf_counter() - t0

    def with_loss(self, local: list[int], loss: float) -> "Pending":
        """Start agreeing on ``local`` flags and ``loss``; ``.result()`` gives the agreed
        flags, the loss averaged over this rank's loss group and the seconds it waited.

        Started as soon as the loss is known (before backward), it completes while backward
        runs: the step waits for it only if some rank is that far behind. A non-finite
        loss on any rank of the group makes the mean non-finite.
        """
        row = torch.tensor([loss, *local], dtype=torch.float64)
        if self.group is None:
            return Pending(None, [row], [0])
        rows = [torch.empty_like(row) for _ in range(self.world_size)]
        work = comm_timing.ORIGINAL["all_gather"](rows, row, group=self.group, async_op=True)
        return Pending(work, rows, self._loss_rows)


class Pending:
    """An agreement under way (see :meth:`Agreement.with_loss`)."""

    def __init__(self, work, rows: list, loss_rows: list[int]):
        self._work, self._rows, self._loss_rows = work, rows, loss_rows

    def result(self) -> tuple[list[int], float, float]:
        t0 = time.perf_counter()
        if self._work is not None:
            self._work.wait()
        table = torch.stack(self._rows)
        flags = [int(v) for v in table[:, 1:].max(dim=0).values.tolist()]
        return flags, float(table[self._loss_rows, 0].mean()), time.perf_counter() - t0
