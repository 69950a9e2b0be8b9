"""Run a function on N fresh gloo processes (a FileStore rendezvous) and collect results.

For rank-side tests that must not share state with the session's ipyparallel ranks,
and for environments where those are not available::

    results = run_ranks(fn, world_size=2, args=(...))   # fn(rank, world_size, *args)

Each process initialises the default group itself (tests only: the workbench runtime
does this on real ranks), runs ``fn``, destroys the group and returns the result.

The processes are forked by a fork server that imported torch (see PRELOAD) once for the whole test
session (``workbench.engine.preload`` does the same for real ranks): a torch import costs
seconds of CPU per process, and nothing in it starts a thread or touches CUDA, so each fork
is as fresh as a new process. Everything else (DeepSpeed, which picks its accelerator once
per process; the workbench) is imported by each process itself, in the caller's environment
and working directory as they are at the call.
"""

from __future__ import annotations

import atexit
import multiprocessing.forkserver
import os
import tempfile
import time
import traceback

try:
    import cloudpickle
except ImportError:  # plain pickle: fn must be importable (module-level in a test module)
    import pickle as cloudpickle
import torch.multiprocessing as mp

__all__ = ["run_ranks", "RankFailure"]

# what the first torch.optim optimizer in a process imports (torch._dynamo, ~2 s of CPU), and
# the first torch.compile (inductor's compile_fx, ~1.7 s; DeepSpeed calls it at its first ZeRO setup)
PRELOAD = ["torch", "torch._dynamo", "torch._inductor.compile_fx", "torch.distributed"]


class RankFailure(RuntimeError):
    pass


def _worker(rank: int, world: int, store_path: str, payload: bytes, queue, env: dict, cwd: str) -> None:
    os.environ.clear()  # the caller's environment at the call, not the fork server's at its start
    os.environ.update(env)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.chdir(cwd)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        fn, args, kwargs = cloudpickle.loads(payload)
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
        try:
            out = fn(rank, world, *args, **kwargs)
        finally:
            dist.destroy_process_group()
        queue.put((rank, True, cloudpickle.dumps(out)))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, False, traceback.format_exc()))


def _context():
    ctx = mp.get_context("forkserver")
    if not _context.started:
        ctx.set_forkserver_preload(PRELOAD)
        atexit.register(_stop_fork_server)  # no process left behind when the session ends
        _context.started = True
    return ctx


_context.started = False


def _stop_fork_server() -> None:
    multiprocessing.forkserver._forkserver._stop()


def run_ranks(fn, world_size: int = 2, *, args=(), kwargs=None, timeout: float = 300.0) -> list:
    """``[fn(rank, world_size, *args, **kwargs) for rank in ranks]``, each in its own process;
    every rank answers within ``timeout`` seconds of the start, or ``queue.Empty`` is raised."""
    ctx = _context()
    queue = ctx.Queue()
    payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
    env, cwd = dict(os.environ), os.getcwd()
    with tempfile.TemporaryDirectory() as d:
        store_path = os.path.join(d, "store")
        procs = [
            ctx.Process(target=_worker, args=(r, world_size, store_path, payload, queue, env, cwd))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, object] = {}
        errors: dict[int, str] = {}
        answered = False
        deadline = time.monotonic() + timeout  # for every rank's answer, not each in turn
        try:
            for _ in range(world_size):
                rank, ok, data = queue.get(timeout=max(0.1, deadline - time.monotonic()))
                if ok:
                    results[rank] = cloudpickle.loads(data)
                else:
                    errors[rank] = data
                    break
            answered = True
        finally:  # a rank that failed, or never answered (timeout): the others are not waited for
            for p in procs:
                p.join(timeout=timeout if answered and not errors else 5)
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    if errors:
        rank, tb = sorted(errors.items())[0]
        raise RankFailure(f"rank {rank} of {world_size} failed:\n{tb}")
    return [results[r] for r in range(world_size)]
