"""Time collectives on the ranks over a sweep of message sizes (nccl-tests' method, small).

Each point: ``warmup`` untimed calls, then ``iters`` calls each timed on its own; a rank's
time is the median of its calls (one late wake-up of a loaded CPU does not move it), the
point's the slowest rank's (a collective ends when its last rank does). Sizes follow nccl-tests: the all-gather size is the gathered output, the
reduce-scatter size the full input; each rank contributes ``size / n`` to both. On NCCL the
buffers are on the rank's GPU and each call is timed by a pair of CUDA events on the current
stream (the host clock would time the launch only), read after one synchronise at the end.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

__all__ = ["KINDS", "time_collective", "sweep"]

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


def _device() -> torch.device:
    """Where the group's buffers must live: this rank's GPU on NCCL, else the CPU."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _call(kind: str, n: int, numel: int, device: torch.device | str = "cpu"):
    """A zero-argument function that runs one ``kind`` collective on ``numel`` fp32 values."""
    if numel % n:
        raise ValueError(f"{numel} values do not split over {n} ranks; use a multiple of {n}")
    full = torch.ones(numel, device=device)
    part = torch.ones(numel // n, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full)
    if kind == "all_gather":
        return lambda: dist.all_gather_single(full, part)
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_single(part, full)
    if kind == "all_to_all":
        out = torch.empty(numel, device=device)
        return lambda: dist.all_to_all_single(out, full)
    if kind == "broadcast":
        return lambda: dist.broadcast(full, src=0)
    raise ValueError(f"unknown collective {kind!r}; choose from {', '.join(KINDS)}")


def time_collective(kind: str, nbytes: int, iters: int = 5, warmup: int = 1) -> float:
    """Seconds per call of ``kind`` on an ``nbytes`` fp32 buffer: the slowest rank's median."""
    n = dist.get_world_size()
    device = _device()
    fn = _call(kind, n, max(n, nbytes // 4), device)
    for _ in range(warmup):
        fn()
    dist.barrier()
    if device.type == "cuda":
        pairs = []
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
        torch.cuda.synchronize()
        times = [a.elapsed_time(b) / 1e3 for a, b in pairs]  # elapsed_time: milliseconds
    else:
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    median = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return float(median.item())


def sweep(kinds=KINDS, sizes=(2**12, 2**14, 2**16, 2**18, 2**20, 2**22), iters: int = 5) -> list[dict]:
    """One row per (collective, size): ``{"collective", "bytes", "seconds", "ranks"}``."""
    n = dist.get_world_size()
    return [
        {"collective": k, "bytes": int(s), "seconds": time_collective(k, int(s), iters), "ranks": n}
        for k in kinds
        for s in sizes
    ]
