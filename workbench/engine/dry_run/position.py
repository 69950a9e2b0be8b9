"""One position of a dry run, in a forked process: lay the model out, step once, count.

The fake process group at the full world size and this position's real rank number, then
``engine.prepare`` (what a live rank runs); a pipeline's first-step initialization and the
optimizer's state made first, as a step in the middle of training finds them; then one step
through the memory census ``plan --live`` takes (:func:`workbench.engine.memory_census.census`)
under :class:`~.tracker.StepTracker`."""

from __future__ import annotations

import re
import time

import torch
import torch.distributed as dist
from torch import nn

from .grouping import coords_of, own_local_shapes_agree, shape_signatures, stage_ranks
from .relay import relay_stage
from .tracker import StepTracker, _storage

__all__ = ["run_position"]

_BLOCK_NUMBER = re.compile(r"(?<=\.)\d+(?=\.)")


def module_bytes(model: nn.Module) -> dict[str, int]:
    """Parameter storage bytes by name with block numbers folded (``layers.*.mlp.w1.weight``)."""
    out: dict[str, int] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        st = _storage(p)
        if id(st) in seen:
            continue
        seen.add(id(st))
        key = _BLOCK_NUMBER.sub("*", name)
        out[key] = out.get(key, 0) + st.nbytes()
    return out


def _default_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-4)


def _warm_optimizer(prepared) -> None:
    """Give the optimizer its state with one update on zero gradients."""
    params = [p for p in prepared.unwrap().parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.zeros_like(p)
    prepared.optimizer.step()
    prepared.optimizer.zero_grad(set_to_none=True)


def _initialize_pipeline(prepared, batch) -> None:
    """Run the schedule's first-step initialization (its stages exchange their shapes and
    infer their recv buffers on a micro-batch) before the measured step, as a step in the
    middle of training finds it done. torch 2.13's single-stage schedules do it in
    ``_initialize_stage``, called at the top of their first ``step``."""
    x, y = batch
    mb = x.shape[0] // prepared.spec.microbatches
    with prepared._autocast_ctx():
        prepared.schedule._initialize_stage((x[:mb],), {}, y[:mb] if prepared.is_last else None)


def run_position(model: nn.Module, request, rank: int, *, fake_mode, vocab: int, sock, group: bool) -> dict:
    """Lay ``model`` out as rank ``rank`` of ``request.world`` and step once; the position's
    report (a :class:`workbench.shared.dry_run.Position` dict without ``position``/``ranks``),
    with ``signatures`` (``{rank: class}`` over its stage) when ``group``."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from ..memory_census import census
    from ..session import prepare

    t0, c0 = time.perf_counter(), time.process_time()
    dist.init_process_group("fake", rank=rank, world_size=request.world, store=FakeStore())
    prepared = prepare(
        model,
        request.optimizer or _default_optimizer,
        request.spec,
        mesh_device="cpu",
        blocks=request.blocks,
        tp_plan=request.tp_plan,
        pp_boundaries=request.pp_boundaries,
    )
    t1, c1 = time.perf_counter(), time.process_time()
    layout = prepared.layout
    shape = tuple(layout["mesh"]["shape"])
    names = tuple(layout["mesh"]["dim_names"])
    schedule = getattr(prepared, "schedule", None)
    if schedule is not None:
        relay_stage(schedule._stage, sock)
    inner = prepared.unwrap()
    with fake_mode:
        batch = (
            torch.randint(0, vocab, (request.batch, request.seq)),
            torch.randint(0, vocab, (request.batch, request.seq)),
        )
        if schedule is not None:
            _initialize_pipeline(prepared, batch)
        _warm_optimizer(prepared)
        tracker = StepTracker()
        tracker.track(inner, prepared.optimizer.state, batch)
        with tracker:
            counted = census(prepared, batch, count_comm=False)
    t2, c2 = time.perf_counter(), time.process_time()
    report = {
        "rank": rank,
        "stage": int(getattr(prepared, "stage_idx", 0)),
        "coords": dict(zip(names, coords_of(rank, shape))),
        "blocks": tuple(layout.get("blocks", [])),
        "param_bytes": counted["bytes"]["parameters"],
        "grad_bytes": counted["bytes"]["gradients"],
        "optim_bytes": counted["bytes"]["optimizer"],
        "activation_bytes": counted["bytes"]["activations"],
        "peak_bytes": tracker.peak,
        "start_bytes": tracker.start,
        "peak_start_bytes": tracker.peak_start,
        "peak_parts": tracker.peak_parts(),
        "modules": module_bytes(inner),
        "collectives": tuple(tracker.collectives()),
        "notes": tuple(layout.get("notes", [])),
    }
    if not own_local_shapes_agree(inner, rank, shape):
        raise RuntimeError(
            f"rank {rank}: the shard arithmetic that groups ranks disagrees with the shapes this rank holds"
        )
    if group:
        report["signatures"] = shape_signatures(inner, rank, stage_ranks(rank, shape, names), shape)
    report["mesh"] = {"shape": list(shape), "dim_names": list(names)}
    report["spec"] = prepared.spec.to_dict()
    report["seconds"] = {
        "prepare": t1 - t0,
        "step": t2 - t1,
        "group": time.perf_counter() - t2,
        "cpu": c2 - c0 + (time.process_time() - c2),
        "cpu_step": c2 - c1,
    }
    return report
