"""Count and time the collectives a rank runs: kind, count, payload bytes, seconds.

Three ways collectives happen during training, and how each is seen here:

1. Python calls to ``torch.distributed.<fn>`` (the loss average, user code, and FSDP2,
   whose ``DefaultAllGather``/``DefaultReduceScatter`` call ``dist.all_gather_single`` and
   ``dist.reduce_scatter_single`` through the module attribute at call time, see
   ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``): :func:`install`
   replaces those attributes on ``torch.distributed`` and ``distributed_c10d`` with
   timing wrappers. A wrapper inside a wrapper (``reduce_scatter_tensor`` calls
   ``reduce_scatter_single``) counts once.
2. DDP's bucket all-reduces run from the C++ reducer and never pass through Python:
   :func:`install_ddp_hook` registers a comm hook (the default hook's arithmetic, plus
   a clock) and records each bucket's bytes.
3. Functional collectives (DTensor redistribution, e.g. the FSDP2 grad-norm reduction)
   go through ``torch.ops._c10d_functional`` and are NOT seen; they are small.

Count and bytes are recorded when a collective is launched (so they belong to the step
that launched them, exactly); time is recorded when it completes: for synchronous
calls the caller's blocked time, for ``async_op=True`` work launch-to-completion through
the work's future (gloo cannot report ``work._get_duration()``: "This Backend doesn't
support getDuration"). gloo has no real reduce-scatter: the profiler shows
``c10d::_reduce_scatter_base_`` executed as ``gloo:all_reduce`` of the FULL buffer,
keeping one slice (checked on torch 2.13), so on gloo a reduce-scatter moves and costs
what an all-reduce of its input does. The bytes counted are the full input buffer (the
nccl-tests convention for reduce-scatter), on every backend.
"""
from __future__ import annotations

import functools
import inspect
import threading
import time

# function name -> (collective kind, argument holding the payload, how to size it)
_SPECS = {
    "all_reduce": ("all_reduce", "tensor", "one"),
    "all_gather": ("all_gather", "tensor_list", "list"),
    "all_gather_into_tensor": ("all_gather", "output_tensor", "one"),
    "all_gather_single": ("all_gather", "output_tensor", "one"),
    "reduce_scatter": ("reduce_scatter", "input_list", "list"),
    "reduce_scatter_tensor": ("reduce_scatter", "input", "one"),
    "reduce_scatter_single": ("reduce_scatter", "input", "one"),
    "all_to_all": ("all_to_all", "input_tensor_list", "list"),
    "all_to_all_single": ("all_to_all", "input", "one"),
    "broadcast": ("broadcast", "tensor", "one"),
    "send": ("send_recv", "tensor", "one"),
    "recv": ("send_recv", "tensor", "one"),
    "isend": ("send_recv", "tensor", "one"),
    "irecv": ("send_recv", "tensor", "one"),
    "barrier": ("barrier", None, "none"),
}

ORIGINAL: dict = {}  # name -> the unwrapped torch.distributed function
_LOCAL = threading.local()
_INSTALL_LOCK = threading.Lock()


class CommStats:
    """Running totals per collective kind, safe to update from gloo's worker threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self.totals: dict[str, list] = {}  # kind -> [count, bytes, time_s]
        self.blocking_s = 0.0  # time callers spent blocked in synchronous collectives

    def launch(self, kind: str, nbytes: int) -> None:
        with self._lock:
            t = self.totals.setdefault(kind, [0, 0, 0.0])
            t[0] += 1
            t[1] += nbytes

    def finish(self, kind: str, seconds: float, blocking: bool) -> None:
        with self._lock:
            self.totals.setdefault(kind, [0, 0, 0.0])[2] += seconds
            if blocking:
                self.blocking_s += seconds

    def snapshot(self) -> dict:
        with self._lock:
            return {"_blocking": self.blocking_s, **{k: tuple(v) for k, v in self.totals.items()}}

    @staticmethod
    def delta(now: dict, before: dict) -> tuple[dict, float]:
        """Per-kind ``{count, bytes, time_s}`` between two snapshots, and blocked seconds."""
        out = {}
        for k, v in now.items():
            if k == "_blocking":
                continue
            c, b, s = v
            c0, b0, s0 = before.get(k, (0, 0, 0.0))
            if c != c0 or s != s0:
                out[k] = {"count": c - c0, "bytes": b - b0, "time_s": s - s0}
        return out, now["_blocking"] - before.get("_blocking", 0.0)


STATS = CommStats()


def _size(value, how: str) -> int:
    if how == "none" or value is None:
        return 0
    if how == "list":
        return sum(t.numel() * t.element_size() for t in value)
    return value.numel() * value.element_size()


def _wrap(name: str, fn):
    kind, arg, how = _SPECS[name]
    sig = inspect.signature(fn)
    params = list(sig.parameters)
    pos = params.index(arg) if arg in params else None

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        if getattr(_LOCAL, "inside", False):
            return fn(*args, **kwargs)
        if arg is None:
            payload = None
        elif pos is not None and pos < len(args):
            payload = args[pos]
        else:
            payload = kwargs.get(arg)
        try:
            nbytes = _size(payload, how)
        except Exception:  # an unusual argument: still count the call
            nbytes = 0
        is_async = kwargs.get("async_op", False) or name in ("isend", "irecv")
        if not is_async and "async_op" in params:
            i = params.index("async_op")
            is_async = bool(args[i]) if i < len(args) else False
        STATS.launch(kind, nbytes)
        _LOCAL.inside = True
        t0 = time.perf_counter()
        try:
            work = fn(*args, **kwargs)
        finally:
            _LOCAL.inside = False
        if is_async and work is not None:
            _time_async(work, kind, t0)
        else:
            STATS.finish(kind, time.perf_counter() - t0, blocking=True)
        return work

    timed.__wrapped_collective__ = fn
    return timed


def _time_async(work, kind: str, t0: float) -> None:
    try:
        fut = work.get_future()
        fut.add_done_callback(lambda _f: STATS.finish(kind, time.perf_counter() - t0, blocking=False))
    except Exception:  # a backend without futures: launch time only
        STATS.finish(kind, time.perf_counter() - t0, blocking=False)


def install() -> None:
    """Wrap the ``torch.distributed`` collectives once per process (idempotent)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    with _INSTALL_LOCK:
        if ORIGINAL:
            return
        for name in _SPECS:
            fn = getattr(c10d, name, None) or getattr(dist, name, None)
            if fn is None:
                continue
            ORIGINAL[name] = fn
            timed = _wrap(name, fn)
            for mod in (dist, c10d):
                if getattr(mod, name, None) is fn:
                    setattr(mod, name, timed)


def uninstall() -> None:
    """Put the original functions back (tests; the wrappers cost ~2 us per call)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    with _INSTALL_LOCK:
        for name, fn in ORIGINAL.items():
            for mod in (dist, c10d):
                if getattr(getattr(mod, name, None), "__wrapped_collective__", None) is fn:
                    setattr(mod, name, fn)
        ORIGINAL.clear()


def _ddp_allreduce_hook(group, bucket):
    """DDP's default hook (average the bucket: divide, then all-reduce SUM) with a clock."""
    import torch.distributed as dist

    buf = bucket.buffer()
    world = group.size() if group is not None else dist.get_world_size()
    buf.div_(world)
    nbytes = buf.numel() * buf.element_size()
    STATS.launch("all_reduce", nbytes)
    STATS.launch("ddp_bucket", nbytes)
    t0 = time.perf_counter()
    all_reduce = ORIGINAL.get("all_reduce", dist.all_reduce)
    fut = all_reduce(buf, group=group, async_op=True).get_future()

    def done(f):
        dt = time.perf_counter() - t0
        STATS.finish("all_reduce", dt, blocking=False)
        STATS.finish("ddp_bucket", dt, blocking=False)
        return f.value()[0]

    return fut.then(done)


def install_ddp_hook(ddp_model) -> str:
    """Time DDP's bucket all-reduces; returns a note saying whether it worked and why not."""
    if getattr(ddp_model, "_workbench_comm_hook", False):
        return "DDP comm hook already installed"
    try:
        ddp_model.register_comm_hook(state=ddp_model.process_group, hook=_ddp_allreduce_hook)
    except Exception as exc:  # e.g. a hook already registered, or backward already ran
        return f"DDP bucket all-reduces are not timed: register_comm_hook refused ({exc})"
    ddp_model._workbench_comm_hook = True
    return "DDP bucket all-reduces timed through a comm hook"
