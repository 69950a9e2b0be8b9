"""Count the bytes this rank really holds for its model: a census, not an estimate.

The planner's predictions are checked against it (:mod:`workbench.planner.live`), so
:func:`census` runs one real training step and counts each storage once, at its storage
size (padding and flat-buffer slack included): what the rank holds, not what the model needs."""

from __future__ import annotations

import time
import weakref

import torch
from torch import nn

__all__ = ["census", "default_batch"]

# DeepSpeed's buffers, as deepspeed 0.19's runtime/zero/stage_1_and_2.py and stage3.py name them
_DS_PARAM_ATTRS = ("bit16_groups_flat", "fp16_partitioned_groups_flat", "parallel_partitioned_bit16_groups")
_DS_GRAD_ATTRS = (
    "averaged_gradients",
    "grads_in_partition",
    "ipg_buffer",
    "grad_partitions_flat_buffer",
    "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition",
)
_DS_MASTER_ATTRS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")


# ------------------------------------------------------------------------ tensor helpers
def _local(t):
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        return t.to_local()
    if hasattr(t, "ds_tensor"):
        return t.ds_tensor
    return t


def _storage_id(t: torch.Tensor, storage) -> int:
    """A storage's identity: its address; for a tensor without data (the fake tensors of
    ``workbench.dry_run``) the storage object torch keeps for it."""
    from torch._subclasses.fake_tensor import is_fake

    return storage._cdata if is_fake(t) else storage.data_ptr()


def _tensors(obj, depth: int = 3):
    """Tensors inside ``obj`` (a tensor, or lists/tuples/dicts of them, ``depth`` deep)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 0 and isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x, depth - 1)
    elif depth > 0 and isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x, depth - 1)


class _Counter:
    """Bytes per part, each storage counted once across all parts."""

    def __init__(self):
        self.seen: set[int] = set()
        self.parts: dict[str, int] = {}
        self.sources: dict[str, dict[str, int]] = {}

    def add(self, part: str, t, source: str) -> None:
        if t is None:
            return
        t = _local(t)
        if not isinstance(t, torch.Tensor) or t.is_meta:
            return
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a subclass without storage
            return
        ptr, nbytes = _storage_id(t, storage), storage.nbytes()
        if ptr == 0 or nbytes == 0 or ptr in self.seen:
            return
        self.seen.add(ptr)
        self.parts[part] = self.parts.get(part, 0) + nbytes
        src = self.sources.setdefault(part, {})
        src[source] = src.get(source, 0) + nbytes

    def get(self, part: str) -> int:
        return self.parts.get(part, 0)


def _innermost_optimizer(opt):
    """The torch optimizer doing the update (DeepSpeed wraps one in ``.optimizer``)."""
    seen = 0
    while not isinstance(opt, torch.optim.Optimizer) and hasattr(opt, "optimizer") and seen < 4:
        opt = opt.optimizer
        seen += 1
    return opt if isinstance(opt, torch.optim.Optimizer) else None


def _module_params(prepared) -> list:
    inner = prepared.unwrap()
    return list(inner.parameters())


def _count_parameters(c: _Counter, prepared, ds_opt) -> None:
    if ds_opt is not None:
        for attr in _DS_PARAM_ATTRS:
            for t in _tensors(getattr(ds_opt, attr, None)):
                c.add("parameters", t, f"deepspeed.{attr}")
    for p in _module_params(prepared):
        c.add("parameters", p, "module parameters")


def _count_buffers(c: _Counter, ds_opt) -> None:
    """DeepSpeed's gradient reduction buckets (``ipg_buckets[dtype].buffer``): allocated
    whole at ``reduce_bucket_size`` elements (default 5e8); gradients are views into them
    during backward, so they are counted here and not as gradients."""
    if ds_opt is None:
        return
    for bucket in (getattr(ds_opt, "ipg_buckets", None) or {}).values():
        for t in _tensors(getattr(bucket, "buffer", None)):
            c.add("buffers", t, "deepspeed.ipg_buckets[dtype].buffer")


def _count_gradients(c: _Counter, prepared, ds_opt, inner_opt) -> None:
    for p in _module_params(prepared):
        c.add("gradients", p.grad, "param.grad")
        c.add("gradients", getattr(p, "grad_accum", None), "param.grad_accum")
    if ds_opt is not None:
        for attr in _DS_GRAD_ATTRS:
            for t in _tensors(getattr(ds_opt, attr, None)):
                c.add("gradients", t, f"deepspeed.{attr}")
        for attr in _DS_MASTER_ATTRS:
            for t in _tensors(getattr(ds_opt, attr, None)):
                c.add("gradients", t.grad, f"deepspeed.{attr}[i].grad")
    if inner_opt is not None:
        for g in inner_opt.param_groups:
            for p in g["params"]:
                c.add("gradients", p.grad, "optimizer param .grad")


def _count_optimizer(c: _Counter, ds_opt, inner_opt) -> None:
    if inner_opt is not None:
        for state in inner_opt.state.values():
            for t in _tensors(state, depth=1):  # includes Adam's scalar step tensors
                c.add("optimizer", t, "optimizer.state")
    if ds_opt is not None:
        for attr in _DS_MASTER_ATTRS:
            for t in _tensors(getattr(ds_opt, attr, None)):
                c.add("optimizer", t, f"deepspeed.{attr} (fp32 master)")
    if inner_opt is not None:  # parameters the optimizer owns but the model does not show
        for g in inner_opt.param_groups:
            for p in g["params"]:
                c.add("optimizer", p, "optimizer-owned parameter copy")


class _SavedTensors:
    """``saved_tensors_hooks`` that records each non-parameter storage packed for backward.

    A storage is told from a later one at the same address (a micro-batch's tensors freed in
    its backward, the next one's allocated there) by a weak reference to it."""

    def __init__(self, param_storages: set[int]):
        self.storages: dict[int, tuple[int, weakref.ref]] = {}  # address -> (bytes, the storage)
        self.total = 0
        self.calls = 0
        self.skipped_params = 0
        self.param_storages = param_storages

    @staticmethod
    def _is_param(t) -> bool:
        # a parameter, or a view of one (linear saves weight.t(), a view of the weight)
        for x in (t, getattr(t, "_base", None)):
            if x is not None and (isinstance(x, nn.Parameter) or (x.is_leaf and x.requires_grad)):
                return True
        return False

    def pack(self, t):
        self.calls += 1
        try:
            local = _local(t)
            st = local.untyped_storage()
            ptr = _storage_id(local, st)
        except (RuntimeError, NotImplementedError, AttributeError):
            return t
        if self._is_param(t) or ptr in self.param_storages:
            self.skipped_params += 1
        elif ptr:
            known = self.storages.get(ptr)
            if known is None or known[1]() is None:
                self.storages[ptr] = (st.nbytes(), weakref.ref(st))
                self.total += st.nbytes()
        return t

    @staticmethod
    def unpack(t):
        return t

    @property
    def bytes(self) -> int:
        return self.total


def default_batch(prepared, batch_size: int = 8, step: int | None = None, seed: int = 0):
    """This rank's share of a global batch of the bundled text, at the model's max_seq_len."""
    from ..models import TextDataset, batch_at
    from ..strategies import model_config_of

    cfg = model_config_of(prepared.unwrap())
    if cfg is None:
        raise ValueError("census needs a batch: the model carries no config (pass batch=(x, y))")
    seq = cfg.max_seq_len
    return batch_at(
        TextDataset(seq),
        batch_size,
        prepared.steps if step is None else step,
        dp_rank=prepared.dp_rank,
        dp_size=prepared.dp_size,
        seed=seed,
    )


def census(prepared=None, batch=None, *, batch_size: int = 8, count_comm: bool = True) -> dict:
    """Run one training step and count what this rank holds.

    ``parameters``: each parameter's local part (a DTensor's shard, a ZeRO-3 partition,
    ZeRO-1/2's flat buffer); ``gradients``: just before the optimizer update (for DeepSpeed
    also at the end of backward, where ZeRO-1 still holds full gradients: the larger is
    reported); ``buffers``: DeepSpeed's reduction buckets; ``optimizer``: its state after
    the step, DeepSpeed's fp32 masters included; ``activations``: what autograd saved for
    backward, parameters excluded. A storage counts once, in the first part that reaches it.
    Returns a plain dict; ``measured`` says what was measured when.

    ``batch`` is this rank's ``(x, y)``; by default a share of a global batch of
    ``batch_size`` sequences of the bundled text. The step really trains the model
    (one optimizer update), like any other step. With ``count_comm`` the collectives of
    the step are counted through :mod:`workbench.engine.comm_timing` (installed if needed;
    for DDP the reducer's bucket clock too).
    """
    from . import comm_timing, session
    from .comm_timing import ORIGINAL, STATS

    if prepared is None:
        prepared = session.prepared()
    if batch is None:
        batch = default_batch(prepared, batch_size)
    comm_notes = []
    ddp_watch = None
    if count_comm:
        comm_timing.install()
        ddp_watch, note = comm_timing.watch_ddp(prepared.model)
        if note:
            comm_notes.append(note)
    x = batch[0]
    ds_opt = prepared.optimizer if prepared.layout.get("path") == "deepspeed" else None
    if ds_opt is not None and isinstance(ds_opt, torch.optim.Optimizer):
        ds_opt = None  # DeepSpeed stage 0 keeps the torch optimizer as is
    inner_opt = _innermost_optimizer(prepared.optimizer)

    c = _Counter()
    grads_at: dict = {}

    def before_update(opt, args, kwargs):
        if grads_at:
            return
        grads_at["bytes"], grads_at["sources"], grads_at["seen"] = count_grads()

    def count_grads() -> tuple[int, dict, set]:
        pc = _Counter()
        _count_parameters(pc, prepared, ds_opt)
        _count_buffers(pc, ds_opt)
        gc = _Counter()
        gc.seen = set(pc.seen)  # a gradient buffer aliasing parameters is not a gradient
        _count_gradients(gc, prepared, ds_opt, inner_opt)
        buffers_peak[0] = max(buffers_peak[0], pc.get("buffers"))
        return gc.get("gradients"), gc.sources.get("gradients", {}), gc.seen - pc.seen

    end_of_backward: dict = {}
    buffers_peak = [0]
    engine = prepared.model if ds_opt is not None else None
    if engine is not None and hasattr(engine, "allreduce_gradients"):
        original_reduce = engine.allreduce_gradients

        def reduce_then_count(*args, **kwargs):
            if not end_of_backward:
                end_of_backward["bytes"], end_of_backward["sources"], _ = count_grads()
            return original_reduce(*args, **kwargs)

        engine.allreduce_gradients = reduce_then_count
    handle = inner_opt.register_step_pre_hook(before_update) if inner_opt is not None else None
    pc0 = _Counter()
    _count_parameters(pc0, prepared, ds_opt)
    saved = _SavedTensors(pc0.seen)
    comm_before = STATS.snapshot() if ORIGINAL else None
    t0 = time.perf_counter()
    try:
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            loss = prepared.train_step(batch)
    finally:
        if handle is not None:
            handle.remove()
        if engine is not None and "allreduce_gradients" in vars(engine):
            del engine.allreduce_gradients
    seconds = time.perf_counter() - t0
    if ddp_watch is not None:
        ddp_watch.record()
    comm = None
    if comm_before is not None:
        delta, _ = STATS.delta(STATS.snapshot(), comm_before)
        comm = {k: {"count": int(v["count"]), "bytes": int(v["bytes"])} for k, v in delta.items()}

    _count_parameters(c, prepared, ds_opt)
    _count_buffers(c, ds_opt)
    if not grads_at:  # no torch optimizer step seen: count the gradients left now
        _count_gradients(c, prepared, ds_opt, inner_opt)
        grads_when = "after the step (no optimizer pre-hook fired)"
    elif end_of_backward.get("bytes", 0) > grads_at["bytes"]:
        # DeepSpeed ZeRO-1: full gradients at the end of backward, partitioned and freed
        # by its post-backward reduction, so the peak is before the update
        c.parts["gradients"] = end_of_backward["bytes"]
        c.sources["gradients"] = end_of_backward["sources"]
        grads_when = "at the end of backward, before DeepSpeed's gradient reduction (the larger of two moments)"
    else:
        c.parts["gradients"] = grads_at["bytes"]
        c.sources["gradients"] = grads_at["sources"]
        c.seen |= grads_at["seen"]
        grads_when = "just before the optimizer update of that step"
    _count_optimizer(c, ds_opt, inner_opt)

    layout = prepared.layout
    return {
        "version": 1,
        "rank": int(layout["rank"]),
        "world_size": int(layout["world_size"]),
        "strategy": layout["strategy"],
        "path": layout["path"],
        "spec": prepared.spec.to_dict(),
        "dp_rank": int(prepared.dp_rank),
        "dp_size": int(prepared.dp_size),
        "batch_shape": [int(s) for s in x.shape],
        "step": int(prepared.steps),
        "loss": float(loss),
        "step_seconds": seconds,
        "bytes": {
            "parameters": c.get("parameters"),
            "gradients": c.get("gradients"),
            "optimizer": c.get("optimizer"),
            "activations": saved.bytes,
            "buffers": max(c.get("buffers"), buffers_peak[0]),
        },
        "sources": c.sources,
        "gradient_moments": {"end_of_backward": end_of_backward.get("bytes"), "before_update": grads_at.get("bytes")},
        "saved_tensor_packs": saved.calls,
        "saved_parameter_packs": saved.skipped_params,
        "not_counted": [
            "DDP reducer bucket buffers (C++-owned; with gradient_as_bucket_view=False "
            "about one more copy of the gradients)"
        ]
        if layout["strategy"] == "ddp"
        else [],
        "comm": comm,
        "comm_notes": comm_notes,
        "measured": {
            "parameters": f"after training step {prepared.steps}: local parameter storage",
            "gradients": f"training step {prepared.steps}, {grads_when}",
            "optimizer": f"after training step {prepared.steps}: optimizer state and master copies",
            "activations": (
                f"training step {prepared.steps}: storages saved for backward during forward+loss "
                f"on a local batch of shape {list(x.shape)}"
            ),
            "buffers": "largest seen at the end of backward, before the update and after the step: communication buckets the strategy allocates whole (DeepSpeed ipg buckets)",
            "comm": (
                "collectives launched during the step (workbench.engine.comm_timing)"
                if comm is not None
                else "not measured: comm_timing is not installed on this rank"
            ),
        },
    }


def census_of_current(batch_size: int = 8) -> dict:
    """``%distrain plan --live``'s step: the census of the rank's current Prepared, with the attention
    kernel seen and the model's config (the fields of ``replies.CensusReply``)."""
    from ..planner.live import config_dict
    from ..strategies import model_config_of
    from .attention_probe import AttentionProbe, hf_attention_implementation
    from .session import prepared as current_prepared

    prepared = current_prepared()
    with AttentionProbe() as probe:
        out = census(prepared, batch_size=batch_size)
    model = prepared.unwrap()
    hf = hf_attention_implementation(model)
    return {
        "census": out,
        "attention": probe.kernel() or ({"eager": "eager"}.get(hf, "flash") if hf else None),
        "attention_evidence": probe.evidence() + (f"; HF attn_implementation={hf}" if hf else ""),
        "model_config": config_dict(model_config_of(model)),
    }
