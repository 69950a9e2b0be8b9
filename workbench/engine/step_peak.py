"""One training step on a live rank, measured the way a dry run predicts it.

:func:`measure_step` runs a step through the memory census under ``torch.profiler``'s memory
events (the CPU allocator's own accounting): the peak is what the rank held when the step
began (its parameters, optimizer state and the batch, each storage once) plus the most the
allocator's total rose above its start. :meth:`workbench.notebook.dry_run_report.DryRun.against`
sets the results beside a dry run's positions."""

from __future__ import annotations

import gc

import torch

__all__ = ["measure_step", "held_bytes"]


def held_bytes(*objs) -> int:
    """Bytes of the distinct storages of the tensors in ``objs`` (modules, optimizer state,
    nested containers), each storage once."""
    from torch.utils._pytree import tree_leaves

    seen: dict[int, int] = {}
    for obj in objs:
        if isinstance(obj, torch.nn.Module):
            obj = [*obj.parameters(), *obj.buffers(), *(p.grad for p in obj.parameters())]
        for t in tree_leaves(obj):
            if isinstance(t, torch.Tensor):
                local = t.to_local() if hasattr(t, "to_local") else t
                st = local.untyped_storage()
                seen.setdefault(st.data_ptr(), st.nbytes())
    return sum(seen.values())


def _allocator_rise(prof) -> int:
    """The most the CPU allocator's total rose above its start during ``prof``."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events.sort(key=lambda e: e.start_ns())
    now = peak = 0
    for e in events:
        if e.device_type().name == "CPU":
            now += e.nbytes()
            peak = max(peak, now)
    return peak


def measure_step(batch, prepared=None) -> dict:
    """One step on ``batch`` (this rank's ``(x, y)``): the census's bytes, ``start_bytes``
    and ``peak_bytes`` (see the module doc), ``rank``."""
    from torch.profiler import ProfilerActivity, profile

    from . import session
    from .memory_census import census

    prepared = prepared if prepared is not None else session.prepared()
    prepared.optimizer.zero_grad(set_to_none=True)  # freed before the profiler starts counting
    gc.collect()
    start = held_bytes(prepared.unwrap(), prepared.optimizer.state, batch)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        counted = census(prepared, batch, count_comm=False)
    return {
        "rank": int(prepared.layout["rank"]),
        "param_bytes": counted["bytes"]["parameters"],
        "grad_bytes": counted["bytes"]["gradients"],
        "optim_bytes": counted["bytes"]["optimizer"],
        "saved_bytes": counted["bytes"]["activations"],
        "start_bytes": start,
        "peak_bytes": start + _allocator_rise(prof),
    }
