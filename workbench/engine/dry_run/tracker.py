"""The peak bytes and the collectives of one step, counted per tensor storage.

A ``TorchDispatchMode`` that counts each storage an op returns (DTensor ops seen as their ops
on local shards) from its birth to its death, the storages held when the step began, and
storage resizes (FSDP2's gathered parameters). torch's ``MemTracker`` does the same with a
per-module attribution whose backward hooks cannot run under a pipeline schedule's
``autograd.grad``. Collectives are grouped by op and the global ranks of their group."""

from __future__ import annotations

import weakref

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, _resolve_process_group
from torch._guards import active_fake_mode
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["StepTracker"]

_DEVICE = torch.ops.prim.device.default
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")
_NOT_COLLECTIVES = ("wait_tensor", "barrier", "monitored_barrier_")


def _group_arg(func) -> tuple[int, str] | None:
    """Where ``func`` takes its process group (index, "pg" or "name"), or None when it is
    not a collective (torch's functional collectives name it, c10d's ops pass the object)."""
    if func.namespace not in _COLLECTIVE_NAMESPACES or func._schema.name.split("::")[-1] in _NOT_COLLECTIVES:
        return None
    for i, a in enumerate(func._schema.arguments):
        if a.name == "group_name":
            return i, "name"
        if "ProcessGroup" in str(a.type):
            return i, "pg"
    return None


def _storage(t: torch.Tensor):
    if isinstance(t, DTensor):
        t = t._local_tensor
    return t.untyped_storage()


class StepTracker(TorchDispatchMode):
    """``with StepTracker() as tr:`` around a step; ``tr.peak``, ``tr.start``, ``tr.peak_start``
    (bytes of the tracked start storages still alive at the peak) and ``tr.collectives()``."""

    def __init__(self):
        super().__init__()
        self._live: dict[int, list] = {}  # id(storage) -> [nbytes, weakref, from the start, made by]
        self._log: list[tuple[str, int, int, str]] = []  # (new|free|resize, id, bytes, op): replayed to the peak
        self._peak_at = 0
        self._op = "before the step"
        self.now = 0
        self.peak = 0
        self.start = 0
        self.peak_start = 0
        self._now_start = 0
        self._comm: dict[tuple[str, tuple[int, ...]], list[int]] = {}
        self._ranks: dict[int, tuple[int, ...]] = {}
        self._collective: dict = {}  # op -> where its group is, None for other ops
        self._fake = None
        self._resize = None

    # ------------------------------------------------------------------ counting
    def _add(self, st, at_start: bool = False, op: str | None = None) -> None:
        key = id(st)
        if key in self._live:
            return
        n = st.nbytes()

        def gone(_, key=key):
            entry = self._live.pop(key, None)
            if entry is not None:
                self.now -= entry[0]
                self._log.append(("free", key, entry[0], entry[3]))
                if entry[2]:
                    self._now_start -= entry[0]

        op = "held when the step began" if at_start else (op or self._op)
        self._live[key] = [n, weakref.ref(st, gone), at_start, op]
        self._log.append(("new", key, n, op))
        self.now += n
        if at_start:
            self._now_start += n
        self._note_peak()

    def _note_peak(self) -> None:
        if self.now > self.peak:
            self.peak = self.now
            self.peak_start = self._now_start
            self._peak_at = len(self._log)

    def peak_parts(self, top: int = 8) -> dict[str, int]:
        """The bytes alive at the peak by the op that made them (the ``top`` largest, the rest
        as "other")."""
        alive: dict[int, list] = {}
        for kind, key, n, op in self._log[: self._peak_at]:
            if kind == "new":
                alive[key] = [n, op]
            elif kind == "resize" and key in alive:
                alive[key][0] += n
            elif kind == "free":
                alive.pop(key, None)
        by_op: dict[str, int] = {}
        for n, op in alive.values():
            by_op[op] = by_op.get(op, 0) + n
        ranked = sorted(by_op.items(), key=lambda kv: -kv[1])
        out = dict(ranked[:top])
        if ranked[top:]:
            out["other"] = sum(n for _, n in ranked[top:])
        return out

    def track(self, *objs) -> None:
        """Count the storages of the tensors inside ``objs`` (modules, optimizers' state,
        nested lists/dicts/tuples) as held when the step starts."""
        for obj in objs:
            if isinstance(obj, torch.nn.Module):
                obj = [*obj.parameters(), *obj.buffers(), *(p.grad for p in obj.parameters())]
            for t in tree_leaves(obj):
                if isinstance(t, torch.Tensor):
                    self._add(_storage(t), at_start=True)
        self.start = self.now

    # ------------------------------------------------------------------ collectives
    def _group_ranks(self, pg) -> tuple[int, ...]:
        key = id(pg)
        if key not in self._ranks:
            self._ranks[key] = tuple(dist.get_process_group_ranks(pg))
        return self._ranks[key]

    def _record(self, func, where, args, kwargs, out) -> None:
        i, kind = where
        arg = args[i] if i < len(args) else kwargs[func._schema.arguments[i].name]
        pg = _resolve_process_group(arg) if kind == "name" else ProcessGroup.unbox(arg)
        nbytes = max(
            (_storage(t).nbytes() for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)), default=0
        )
        key = (func._schema.name.split("::")[-1].rstrip("_"), self._group_ranks(pg))
        entry = self._comm.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += int(nbytes)

    def collectives(self) -> list[dict]:
        """``[{"op", "ranks", "count", "bytes"}]``: each collective of the step by its group."""
        return [
            {"op": op, "ranks": list(ranks), "count": c, "bytes": b}
            for (op, ranks), (c, b) in sorted(self._comm.items())
        ]

    # ------------------------------------------------------------------ the mode
    def __enter__(self):
        self._fake = active_fake_mode()
        original = torch.UntypedStorage.resize_
        tracker = self

        def resize_(st, size):
            out = original(st, size)
            entry = tracker._live.get(id(st))
            if entry is None:
                tracker._add(st, op="storage resize_ (FSDP's gathered parameters)")
            else:
                n = st.nbytes()
                tracker._log.append(("resize", id(st), n - entry[0], entry[3]))
                tracker.now += n - entry[0]
                if entry[2]:
                    tracker._now_start += n - entry[0]
                entry[0] = n
                tracker._note_peak()
            return out

        self._resize = original
        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE:
            return func(*args)  # asked of every fake tensor, many times a step: no storage
        if DTensor in types:
            return NotImplemented  # DTensor turns it into ops on the local shards, seen next
        kwargs = kwargs or {}
        self._op = func.__name__
        out = func(*args, **kwargs)
        if active_fake_mode() is not self._fake:
            return out  # DTensor's sharding propagation on its own fake tensors
        where = self._collective.get(func, False)
        if where is False:
            where = self._collective[func] = _group_arg(func)
        if where is not None:
            self._record(func, where, args, kwargs, out)
        if isinstance(out, torch.Tensor):
            self._add(out.untyped_storage())
        elif isinstance(out, (tuple, list)):
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self._add(_storage(t))
        return out
