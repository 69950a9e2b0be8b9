"""Run a function in a fresh process that is a world-size-1 workbench rank on GPU 0 (NCCL).

A fresh process per call: CUDA, NCCL and the workbench's per-process state (the current
trainer, the collective wrappers, the checkpoint group) start clean, and the test process
itself never initialises CUDA. ``fn`` must be importable (module level in a test module);
what it returns comes back pickled.
"""

from __future__ import annotations

import multiprocessing as mp
import os


def _entry(fn, args):
    from workbench.engine import runtime

    runtime.bootstrap(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        master_addr="127.0.0.1",
        master_port=runtime.free_port(),
        backend="nccl",
        timeout_s=120,
        threads=int(os.environ.get("OMP_NUM_THREADS") or 4),
        gpu_ids=[0] if not os.environ.get("CUDA_VISIBLE_DEVICES") else None,
        pin_visible_gpu=True,
    )
    import torch.distributed as dist

    try:
        return fn(*args)
    finally:
        dist.destroy_process_group()


def on_one_gpu(fn, *args, timeout: float = 180.0):
    """``fn(*args)`` in a spawned world-size-1 NCCL rank on GPU 0; its result."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply_async(_entry, (fn, args)).get(timeout)
