"""Count and time the collectives a rank runs: kind, count, payload bytes, seconds.

Python calls to ``torch.distributed`` (FSDP2's included) are timed by the wrappers
:func:`install` puts in place; DDP's bucket all-reduces, launched from C++, are read from
DDP's own reducer clock (:class:`DDPWatch`); functional collectives (DTensor redistribution)
are not seen, and are small. A count belongs to the step that launched the collective."""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections import deque

from . import flight_record

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

    def __init__(self, new_event=None):
        self._lock = threading.Lock()
        # CUDA events of synchronous collectives on CUDA tensors, not read yet:
        # (kind, start_event, end_event, host launch time, blocking), oldest first
        self._pending: deque = deque()
        self._new_event = new_event or _cuda_timing_event
        self.totals: dict[str, list] = {}  # kind -> [count, bytes, time_s]
        self.blocking_s = 0.0  # time callers spent blocked in synchronous collectives
        # (kind, start, end, blocking) in perf_counter time, newest last: the timeline's comm lane
        self.spans: deque = deque(maxlen=8192)
        self.span_count = 0  # spans ever appended (see spans_since)

    def launch(self, kind: str, nbytes: int) -> None:
        with self._lock:
            t = self.totals.setdefault(kind, [0, 0, 0.0])
            t[0] += 1
            t[1] += nbytes

    def finish(self, kind: str, seconds: float, blocking: bool, start: float | None = None) -> None:
        with self._lock:
            if start is not None:
                self.spans.append((kind, start, start + seconds, blocking))
                self.span_count += 1
            self.totals.setdefault(kind, [0, 0, 0.0])[2] += seconds
            if blocking:
                self.blocking_s += seconds

    def launch_on_device(self) -> tuple:
        """A start event, recorded now on the current stream, and its unrecorded end event."""
        start, end = self._new_event(), self._new_event()
        start.record()
        return start, end

    def finish_on_device(self, kind: str, start, end, t0: float, blocking: bool) -> None:
        """Record ``end`` after the collective; its time is read later by :meth:`resolve`."""
        end.record()
        with self._lock:
            self._pending.append((kind, start, end, t0, blocking))
            many = len(self._pending) > 1024
        if many:  # a loop that never reads its figures: do not hold events without bound
            self.resolve()

    def resolve(self) -> int:
        """Turn the device events whose end has completed into times (oldest first, stopping
        at the first one still running, so spans stay in launch order); returns how many
        are still pending. ``elapsed_time`` is in milliseconds."""
        done = []
        with self._lock:
            while self._pending and self._pending[0][2].query():
                done.append(self._pending.popleft())
            left = len(self._pending)
        for kind, start, end, t0, blocking in done:
            self.finish(kind, start.elapsed_time(end) / 1e3, blocking, start=t0)
        return left

    def blocked(self, seconds: float) -> None:
        """Time a step waited on collectives it did not call itself (DDP's exposed wait)."""
        with self._lock:
            self.blocking_s += seconds

    def spans_since(self, count: int) -> list:
        """Collective spans finished after ``span_count`` was ``count``, oldest first."""
        self.resolve()
        with self._lock:
            k = min(self.span_count - count, len(self.spans))
            return [s for _, s in zip(range(k), reversed(self.spans))][::-1]

    def snapshot(self) -> dict:
        self.resolve()
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


def _cuda_timing_event():
    import torch

    return torch.cuda.Event(enable_timing=True)


STATS = CommStats()


def _on_cuda(value, how: str) -> bool:
    if how == "none" or value is None:
        return False
    first = value[0] if how == "list" and len(value) else value
    return bool(getattr(first, "is_cuda", False))


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
    gpos = params.index("group") if "group" in params else None
    peer = next((p for p in ("dst", "src") if p in params), None)  # send/recv's other rank, broadcast's root
    ppos = params.index(peer) if peer else None

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
        group = args[gpos] if gpos is not None and gpos < len(args) else kwargs.get("group")
        other = args[ppos] if ppos is not None and ppos < len(args) else kwargs.get(peer, -1)
        try:
            nbytes = _size(payload, how)
        except Exception:  # an unusual argument: still count the call
            nbytes = 0
        is_async = kwargs.get("async_op", False) or name in ("isend", "irecv")
        if not is_async and "async_op" in params:
            i = params.index("async_op")
            is_async = bool(args[i]) if i < len(args) else False
        on_cuda = _on_cuda(payload, how)
        try:
            events = STATS.launch_on_device() if on_cuda else None
        except Exception:  # no usable CUDA timing here: the host clock, as on CPU
            events = None
        STATS.launch(kind, nbytes)
        slot = flight_record.enter(
            name,
            group,
            payload,
            how,
            nbytes,
            peer=other if isinstance(other, int) else -1,
            is_async=is_async,
            on_device=on_cuda,
        )
        _LOCAL.inside = True
        t0 = time.perf_counter()
        try:
            work = fn(*args, **kwargs)
        finally:
            _LOCAL.inside = False
            flight_record.leave(slot)
        if is_async and work is not None:
            _time_async(work, kind, t0, events)
        elif events is not None:
            STATS.finish_on_device(kind, *events, t0, blocking=True)
        else:
            STATS.finish(kind, time.perf_counter() - t0, blocking=True, start=t0)
        return work

    timed.__wrapped_collective__ = fn
    return timed


def _time_async(work, kind: str, t0: float, events=None) -> None:
    """Time ``work`` to its completion. On CUDA the future completes at launch, but its
    callbacks run with the current stream made to wait for the collective (c10's
    ``Future::invokeCallback``), so an end event recorded there completes with it."""
    try:
        fut = work.get_future()
        if events is not None:
            fut.add_done_callback(lambda _f: STATS.finish_on_device(kind, *events, t0, blocking=False))
        else:
            fut.add_done_callback(lambda _f: STATS.finish(kind, time.perf_counter() - t0, blocking=False, start=t0))
    except Exception:  # a backend without futures: launch time only
        STATS.finish(kind, time.perf_counter() - t0, blocking=False)


def original(name: str):
    """``torch.distributed.<name>`` for the workbench's own collectives, which are not the user's
    training traffic: not timed (installed or not), but in the flight record, marked as the
    workbench's, so that a hang in one is named with its sequence number like any other."""
    import torch.distributed as dist

    fn = ORIGINAL.get(name) or getattr(dist, name)
    fn = getattr(fn, "__wrapped_collective__", fn)
    if not flight_record.installed():
        return fn
    own = _OWN.get(name)
    if own is None or own.__wrapped_collective__ is not fn:
        own = _OWN[name] = _recorded(name, fn)
    return own


_OWN: dict = {}  # name -> the workbench's recorded, untimed form of the collective


def _recorded(name: str, fn):
    _, arg, how = _SPECS[name]
    params = list(inspect.signature(fn).parameters)
    pos = params.index(arg) if arg in params else None
    gpos = params.index("group") if "group" in params else None

    def recorded(*args, **kwargs):
        if getattr(_LOCAL, "inside", False):
            return fn(*args, **kwargs)
        payload = None if pos is None else (args[pos] if pos < len(args) else kwargs.get(arg))
        group = args[gpos] if gpos is not None and gpos < len(args) else kwargs.get("group")
        try:
            nbytes = _size(payload, how)
        except Exception:
            nbytes = 0
        is_async = bool(kwargs.get("async_op", False))
        slot = flight_record.enter(name, group, payload, how, nbytes, is_async=is_async, own=True)
        _LOCAL.inside = True
        try:
            return fn(*args, **kwargs)
        finally:
            _LOCAL.inside = False
            flight_record.leave(slot)

    recorded.__wrapped_collective__ = fn
    return recorded


def install() -> None:
    """Wrap the ``torch.distributed`` collectives once per process (idempotent).

    Wrapped on ``torch.distributed`` and ``distributed_c10d`` both: FSDP2 calls
    ``dist.all_gather_single`` / ``reduce_scatter_single`` through the module attribute at
    call time. A call on CPU tensors is timed by the host clock, one on CUDA tensors by a
    pair of events on the current stream (the host would time only the launch), read later
    by :meth:`CommStats.resolve`. A reduce-scatter counts its full input (nccl-tests'
    convention): gloo runs it as an all-reduce of the whole buffer.
    """
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
    """Put the original functions back (tests)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    with _INSTALL_LOCK:
        for name, fn in ORIGINAL.items():
            for mod in (dist, c10d):
                if getattr(getattr(mod, name, None), "__wrapped_collective__", None) is fn:
                    setattr(mod, name, fn)
        ORIGINAL.clear()


class DDPWatch:
    """DDP's gradient all-reduces, as DDP's own C++ reducer clocks them: count, bytes, time.

    Not a comm hook: any Python comm hook makes the reducer call into Python for every
    bucket and take the GIL on gloo's thread, a visible cost on a small step
    (benchmarks/FINDINGS.md). The reducer already keeps a clock (first bucket launched, last
    bucket done, end of backward compute) for its runtime logging, read after the step.

    What is recorded per synchronising backward: one ``all_reduce`` (and ``ddp_bucket``)
    per gradient bucket with the bucket's bytes (the buckets DDP rebuilt after its first
    iteration, where it did); as time, the span from the first bucket's launch to the
    last one's completion (overlapping backward); the part of it after backward compute
    ended, the step's exposed wait, goes to the blocked time (``time_comm_wait_s``). On
    GPU the reducer's clock is CUDA events, read after the step has synchronised.
    """

    def __init__(self, ddp):
        self.ddp = ddp
        ddp._set_ddp_runtime_logging_sample_rate(1)
        self._seen = None
        # (comm_s, exposed_s, rebuilt) of the latest record; rebuilt: DDP rebuilt its buckets
        # in that step's forward, with a broadcast from C++ that no wrapper here sees
        self.last: tuple[float, float, bool] | None = None
        self._rebuilt = False

    def record(self) -> bool:
        """Count the gradient all-reduces of the latest synchronising backward, once; False
        when there was none since the last call (accumulation micro-batches, eval)."""
        logger = getattr(self.ddp, "logger", None)
        if logger is None:
            return False
        logger.set_runtime_stats_and_log()  # DDP does this at the next forward; now, for this step
        data = self.ddp._get_ddp_logging_data()
        iteration = data.get("iteration")
        if not iteration or iteration == self._seen:
            return False
        self._seen = iteration
        key = "rebuilt_bucket_sizes" if data.get("has_rebuilt_buckets") else "bucket_sizes"
        sizes = [int(s) for s in str(data.get(key) or "").split(",") if s.strip()]
        for nbytes in sizes:
            STATS.launch("all_reduce", nbytes)
            STATS.launch("ddp_bucket", nbytes)
        comm_s = data.get("backward_comm_time", 0) / 1e9
        exposed_s = max(0.0, comm_s - data.get("backward_compute_comm_overlap_time", 0) / 1e9)
        STATS.finish("all_reduce", comm_s, blocking=False)
        STATS.finish("ddp_bucket", comm_s, blocking=False)
        STATS.blocked(exposed_s)
        rebuilt = bool(data.get("has_rebuilt_buckets"))
        self.last = (comm_s, exposed_s, rebuilt and not self._rebuilt)
        self._rebuilt = rebuilt
        return True


def watch_ddp(model) -> tuple[DDPWatch | None, str]:
    """The :class:`DDPWatch` of a DDP model (one per model, shared by the trainer and the
    memory census) and a note saying how its all-reduces are seen; ``None`` for other models."""
    if not hasattr(model, "_get_ddp_logging_data"):
        return None, ""
    watch = getattr(model, "_workbench_ddp_watch", None)
    if watch is None:
        try:
            watch = DDPWatch(model)
        except Exception as exc:  # a DDP without runtime logging
            return None, f"DDP bucket all-reduces are not timed: its reducer clock is unavailable ({exc})"
        model._workbench_ddp_watch = watch
    return watch, "DDP bucket all-reduces read from DDP's reducer clock (no comm hook on the step path)"
