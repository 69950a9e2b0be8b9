"""Rank bootstrap: environment, threads, device and the default process group.

The notebook calls :func:`bootstrap` on every rank at once (``init_process_group`` is a
rendezvous). What the rest of the engine needs (rank, world size, device) is kept in one
:class:`RankContext`, so nothing else reads environment variables; they are set before torch
is imported, so that ``OMP_NUM_THREADS`` and ``CUDA_VISIBLE_DEVICES`` take effect."""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import socket
import sys
import time

from ..shared.wire import ENV_HOST_SLOT, LARGE_LOCAL_FROM

_CONTEXT: RankContext | None = None
_STACK_FILE = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankContext:
    """What a rank knows about itself once bootstrapped."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str
    device: str
    host: str
    pid: int
    threads: int
    master_addr: str
    master_port: int
    timeout_s: float
    framework: str = "torch"  # "jax": jax.distributed is initialised, torch.distributed is not


def free_port() -> int:
    """A TCP port that is free on this host right now (asked of the kernel)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def identity(toward: str | None = None) -> dict:
    """Host, pid, launcher-provided rank and local rank of this process (before bootstrap).

    ``addr`` is this host's address on the route to ``toward`` (the notebook's address):
    the one other hosts reach this rank by, rank 0's becomes ``MASTER_ADDR``.
    """

    def first(*names):
        for var in names:
            if var in os.environ:
                return int(os.environ[var])
        return None

    addr = "127.0.0.1"
    if toward:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((toward, 9))  # a route lookup: no packet is sent
            addr = s.getsockname()[0]
    slot = os.environ.get(ENV_HOST_SLOT)
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "addr": addr,
        "launcher_rank": first("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"),
        "launcher_local_rank": first("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"),
        "slot": int(slot) if slot and slot.isdigit() else None,
    }


def interface_of(addr: str) -> str | None:
    """The network interface that holds ``addr`` on this host."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == addr for a in addrs):
            return name
    return None


def visible_gpu(local_rank: int, visible: str | None, count: int) -> str | None:
    """This rank's GPU among those its host (or Slurm's allocation) makes visible."""
    ids = [x for x in (visible.split(",") if visible else [str(i) for i in range(count)]) if x.strip()]
    return ids[local_rank % len(ids)].strip() if ids else None


def _gpu_count() -> int:
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def bootstrap(
    *,
    rank: int,
    world_size: int,
    local_rank: int,
    local_world_size: int,
    master_addr: str,
    master_port: int,
    backend: str,
    timeout_s: float,
    threads: int,
    gpu_ids: list[int] | None,
    stack_dir: str | None = None,
    sys_path: list[str] | None = None,
    parent_pid: int | None = None,
    also_end: list[int] | None = None,
    pin_visible_gpu: bool = False,
    interface_addr: str | None = None,
    framework: str = "torch",
    extra_env: dict[str, str] | None = None,
    process_group: bool = True,
    store_file: str | None = None,
) -> dict:
    """Set the rank's environment, pin its device and initialise the process group
    (``framework="jax"``: ``jax.distributed`` instead, :mod:`workbench.engine.jax_runtime`).

    ``sys_path`` holds the notebook's working directory, so that the user's own
    modules beside the notebook import on the ranks too. ``extra_env``: settings the
    process group reads when it initialises (``--nccl``: ``NCCL_*``), set before it does.

    Returns :func:`describe` of the new context. Raises if the process group is
    already initialised (a rank set is bootstrapped once; restart makes new ranks).
    ``process_group=False``: a rank that replaces a lost replica of a fault-tolerant run
    (``notebook.runs.fault_tolerant``); the set's process group cannot take a new member, and the
    run talks over its replica's own groups. ``store_file``: the group meets in a file store
    there (a large set on one host, ``wire.LARGE_LOCAL_FROM``) instead of rank 0's TCP store.
    """
    global _CONTEXT
    env = {
        "RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }
    if gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu_ids[local_rank % len(gpu_ids)])
    elif pin_visible_gpu:  # Slurm/SSH: this host's GPUs (Slurm sets CUDA_VISIBLE_DEVICES per job)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpu = visible_gpu(local_rank, visible, 0 if visible else _gpu_count())
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
            gpu_ids = [int(gpu)] if gpu.isdigit() else [0]
    if interface_addr:
        # gloo and NCCL find their interface from the host name, which another host may not
        # resolve (or resolves to loopback): use the one on the route to the notebook
        iface = interface_of(interface_addr)
        if iface:
            env.setdefault("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", iface))
            env.setdefault("NCCL_SOCKET_IFNAME", os.environ.get("NCCL_SOCKET_IFNAME", iface))
    env.update(extra_env or {})
    os.environ.update(env)
    for path in reversed(sys_path or []):
        if path not in sys.path:
            sys.path.insert(0, path)
    if stack_dir:
        _install_stack_dump(stack_dir, rank)
        from . import rank_debug

        rank_debug.install(rank)
    if parent_pid:
        _exit_with_parent(parent_pid, also_end or [])
    from .cell_runner import lighten_kernel

    lighten_kernel()
    if stack_dir:
        _keep_records(os.path.dirname(stack_dir), rank, framework)
    if framework == "jax":
        from . import jax_runtime

        settle_malloc()
        device = jax_runtime.initialize(
            rank=rank, world_size=world_size, coordinator=f"{master_addr}:{master_port}", timeout_s=timeout_s
        )
        _CONTEXT = RankContext(
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            local_world_size=local_world_size,
            backend="gloo" if device == "cpu" else "xla",
            device=device,
            host=socket.gethostname(),
            pid=os.getpid(),
            threads=threads,
            master_addr=master_addr,
            master_port=master_port,
            timeout_s=timeout_s,
            framework="jax",
        )
        return describe(with_memory=False)

    import datetime

    import torch
    import torch.distributed as dist

    settle_malloc()
    torch.set_num_threads(threads)
    if gpu_ids and torch.cuda.is_available():
        torch.cuda.set_device(0)
        device = "cuda:0"
    else:
        device = "cpu"
    if backend == "auto":
        backend = "nccl" if device.startswith("cuda") else "gloo"
    if dist.is_initialized():
        raise RuntimeError(f"rank {rank}: the process group is already initialised")
    kwargs = {}
    if backend == "nccl":
        kwargs["device_id"] = torch.device(device)
    if process_group:
        lazy_gloo(backend, world_size)
        if store_file:
            init_method = f"file://{store_file}"
        else:
            init_method = f"tcp://{master_addr}:{master_port}"
            if rank != 0:
                await_store(master_addr, master_port, timeout_s)
        dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
            **kwargs,
        )
    _CONTEXT = RankContext(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        backend=backend,
        device=device,
        host=socket.gethostname(),
        pid=os.getpid(),
        threads=threads,
        master_addr=master_addr,
        master_port=master_port,
        timeout_s=timeout_s,
    )
    return describe(with_memory=False)


STORE_POLL_S = 0.005


def lazy_gloo(backend: str, world_size: int) -> bool:
    """From ``LARGE_LOCAL_FROM`` ranks, gloo connects a pair of ranks when they first talk
    (``TORCH_GLOO_LAZY_INIT``), not all pairs at start: at 64 ranks the full mesh is 2,016
    connections and 4,032 reads of rank 0's store, each answered by its one store thread
    (benchmarks/FINDINGS.md). Smaller sets connect every pair at start; a setting of the
    user's own is kept. True where lazy connection is in force."""
    if backend != "gloo" or world_size < LARGE_LOCAL_FROM:
        return os.environ.get("TORCH_GLOO_LAZY_INIT") == "1"
    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")
    return os.environ["TORCH_GLOO_LAZY_INIT"] == "1"


def await_store(addr: str, port: int, timeout_s: float) -> bool:
    """Wait until rank 0's store listens on ``addr:port``; True once it does.

    A rank whose first connection to the store is refused backs off for about half a
    second before it tries again (torch's TCPStore client): rank 0 binds the store only
    when its own bootstrap runs, at times a few milliseconds after the others', and that
    half second would be most of the process group's start: probing every few milliseconds
    first, the group forms in tens of milliseconds. On a timeout the process group's own
    connect reports the failure.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((addr, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))).close()
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(STORE_POLL_S)


# glibc's thresholds where its own dynamic adjustment ends (once a 32 MB block was freed)
MALLOC_SETTLED = {-3: 32 * 2**20, -1: 64 * 2**20}  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
_MALLOC_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")


def settle_malloc() -> bool:
    """Fix glibc's mmap and trim thresholds at the values its dynamic adjustment settles on.

    A rank lives through many layouts and cells, and where glibc's thresholds stand after
    that history decides whether a training step's few-MB buffers (ZeRO's gradient buckets)
    come from the heap or from fresh pages: a bucket of fresh pages every step in some prepares
    and none in others (benchmarks/FINDINGS.md, the ZeRO rows). ``malloc_trim`` still returns freed
    heap. Left alone where the user set glibc's malloc variables; False where not glibc."""
    if any(v in os.environ for v in _MALLOC_ENV[:3]) or "malloc" in os.environ.get(_MALLOC_ENV[3], ""):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        return all(libc.mallopt(param, value) == 1 for param, value in MALLOC_SETTLED.items())
    except (OSError, AttributeError):  # not glibc
        return False


# The process whose death ends this rank: the notebook kernel, or the keeper process of a
# set detached from it (``rehome``); a list so the watch thread sees a change at once.
_OWNER: list[int] = []


def rehome(owner_pid: int) -> dict:
    """From now on this rank ends when ``owner_pid`` dies, not its old owner (``%distrain detach``:
    the keeper process; ``attach``: the kernel that took the set back). Rank 0 still ends the
    controller with it."""
    if not _OWNER:
        raise RuntimeError("this rank does not end with a notebook (it was started on another host)")
    _OWNER[0] = int(owner_pid)
    return {"rank": context().rank if _CONTEXT is not None else None, "owner": int(owner_pid)}


def _exit_with_parent(parent_pid: int, also_end: list[int]) -> None:
    """End this rank (and ``also_end``: the controller, from rank 0) when the notebook dies.

    A notebook kernel that is killed (SIGKILL, OOM, a crashed test runner) runs no
    clean-up; without this its ranks and controller would live on as orphans. The watch
    blocks on a pidfd (readable once the owner has exited, zombie or reaped), so it never
    wakes while the notebook lives; without pidfds it polls once a second. When the owner
    was changed meanwhile (:func:`rehome`), the watch goes on with the new one.
    """
    import threading

    import psutil

    _OWNER[:] = [parent_pid]

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def nanny() -> list[int]:
        # ipyparallel's nanny (this engine's child) would outlive us by seconds, telling a
        # controller that is already gone
        try:
            return [c.pid for c in psutil.Process().children() if "ipyparallel.engine.nanny" in " ".join(c.cmdline())]
        except psutil.Error:
            return []

    def wait_for_exit(pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfds here (not Linux >= 5.3), or already gone
            fd = None
        if fd is not None:
            import select

            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll():
                pass
            os.close(fd)
        while alive(pid):
            time.sleep(1.0)

    def watch() -> None:
        while True:
            owner = _OWNER[0]
            wait_for_exit(owner)
            if _OWNER[0] == owner or not alive(_OWNER[0]):
                break
        for pid in [*also_end, *nanny()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(0)

    threading.Thread(target=watch, name="workbench-parent-watch", daemon=True).start()


def _install_stack_dump(stack_dir: str, rank: int) -> None:
    """Let the notebook ask this rank for its Python stacks with SIGUSR1.

    faulthandler writes from a signal handler in C, so it answers even while the
    rank is blocked inside a collective (where Python code cannot run).
    """
    global _STACK_FILE
    os.makedirs(stack_dir, exist_ok=True)
    _STACK_FILE = open(os.path.join(stack_dir, f"rank{rank}.stack"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=_STACK_FILE, all_threads=True, chain=False)


def _keep_records(folder: str, rank: int, framework: str) -> None:
    """This rank's output log and, on torch, its collective flight record, in the set's ``folder``."""
    from . import rank_log

    rank_log.install(os.path.join(folder, "logs"), rank)
    if framework == "torch":
        from . import comm_timing, flight_record

        flight_record.install(os.path.join(folder, "flight"), rank)
        comm_timing.install()


def context() -> RankContext:
    """The bootstrapped context; a clear error where the rank set was not started."""
    if _CONTEXT is None:
        raise RuntimeError(
            "this process is not a workbench rank: start ranks with `%distrain start -n N` "
            "and run code on them with `%%distrain`"
        )
    return _CONTEXT


def describe(with_memory: bool = True) -> dict:
    """Status of this rank as a plain dict (sent to the notebook). ``with_memory=False`` at
    start-up: the notebook reads the ranks' memory itself, and USS means a walk of the rank's
    page tables, most of a large set's bootstrap CPU past the group (benchmarks/FINDINGS.md)."""
    ctx = context()
    info = dataclasses.asdict(ctx)
    if with_memory:
        info.update(memory())
    if ctx.backend == "nccl" or any(k.startswith("NCCL_") for k in os.environ):
        info["nccl"] = nccl_settings(os.environ, _nccl_version())
    info["time"] = time.time()
    return info


def nccl_settings(environ, version: str | None) -> str:
    """NCCL's version and the ``NCCL_*`` settings in force on this rank, one line for status."""
    env = " ".join(f"{k}={v}" for k, v in sorted(environ.items()) if k.startswith("NCCL_"))
    return (f"NCCL {version}" if version else "no NCCL in this torch") + (f"; {env}" if env else "; no NCCL_* set")


def _nccl_version() -> str | None:
    try:
        import torch

        return ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # NCCL not built into this torch
        return None


def memory() -> dict:
    """Resident memory of this rank, and GPU memory where there is a GPU."""
    out: dict = {}
    try:
        import psutil

        mi = psutil.Process().memory_full_info()
        out["rss_bytes"] = int(mi.rss)
        out["uss_bytes"] = int(getattr(mi, "uss", mi.rss))
    except Exception:  # pragma: no cover - psutil missing fields on some platforms
        pass
    torch = sys.modules.get("torch")
    if torch is not None and _CONTEXT is not None and _CONTEXT.device.startswith("cuda"):
        out["gpu_allocated_bytes"] = int(torch.cuda.memory_allocated())
        out["gpu_reserved_bytes"] = int(torch.cuda.memory_reserved())
        out["gpu_peak_bytes"] = int(torch.cuda.max_memory_allocated())
    return out


def leave_group() -> bool:
    """Destroy this rank's process group, closing its connections to the other ranks.

    Used after a rank's cell failed while others wait for it in a collective: gloo
    gives a blocked peer no way out (SIGINT waits for the collective, ``abort()`` on
    the peer does not wake it), but a closed connection makes the peer's collective
    raise at once. Returns whether there was a group to destroy.
    """
    if _CONTEXT is not None and _CONTEXT.framework != "torch":
        return False  # no torch process group on a JAX rank
    import torch.distributed as dist

    if not dist.is_initialized():
        return False
    from torch.distributed import distributed_c10d

    group = distributed_c10d._get_default_group()
    try:
        group.shutdown()
    except Exception:
        pass
    del group
    dist.destroy_process_group()
    # a collective that raised on this rank left the group referenced from the saved
    # traceback: drop it, so that the group's connections really close
    sys.last_type = sys.last_value = sys.last_traceback = None
    if hasattr(sys, "last_exc"):
        sys.last_exc = None
    ip = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if ip is not None:
        ip.last_execution_result = None
    import gc

    gc.collect()
    return True


def rejoin_group(master_port: int) -> dict:
    """Initialise a new default process group (same ranks, a new rendezvous port).

    Called on every rank together once a broken group has been left; the rank's
    Python state is kept, but objects built on the old group (DDP wrappers, subgroups)
    hold the old, destroyed one.
    """
    import datetime

    global _CONTEXT
    ctx = context()
    if ctx.framework != "torch":
        raise RuntimeError(
            f"rank {ctx.rank} runs {ctx.framework}, which has no torch process group to re-initialise: "
            "`%distrain restart` brings the ranks back"
        )
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    kwargs = {}
    if ctx.backend == "nccl":
        import torch

        kwargs["device_id"] = torch.device(ctx.device)
    if ctx.rank != 0:
        await_store(ctx.master_addr, master_port, ctx.timeout_s)
    dist.init_process_group(
        backend=ctx.backend,
        init_method=f"tcp://{ctx.master_addr}:{master_port}",
        rank=ctx.rank,
        world_size=ctx.world_size,
        timeout=datetime.timedelta(seconds=ctx.timeout_s),
        **kwargs,
    )
    _CONTEXT = dataclasses.replace(ctx, master_port=master_port)
    from . import flight_record

    flight_record.forget_groups()  # the new group's collectives count from 1 on every rank
    return describe(with_memory=False)


def refuse_unless_torch(what: str) -> None:
    """torch and JAX never share a rank set: torch's layouts need the torch process group."""
    ctx = _CONTEXT
    if ctx is not None and ctx.framework != "torch":
        raise RuntimeError(
            f"{what} works on torch.distributed, and this rank set runs {ctx.framework} "
            f"(started with --framework {ctx.framework}): start a torch set beside it with "
            "`%distrain start -n N --session NAME` and run torch cells there"
        )
