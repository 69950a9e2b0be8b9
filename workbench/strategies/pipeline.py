"""Pipeline parallel with ``torch.distributed.pipelining``: each rank is one stage that
owns a contiguous slice of ``model.layers`` (stage 0 also the embedding, the last stage
the final norm and output head), torchtitan style: the stage deletes what it does not own.

Schedules: GPipe (Huang et al. 2019) runs all microbatch forwards, then all backwards;
1F1B (PipeDream-Flush, Narayanan et al. 2021) interleaves them so at most ``pp``
microbatches of activations are alive. Both compute the same gradients.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .base import TORCH_DTYPES, Context, Prepared, PrepareError, build_optimizer, apply_activation_checkpointing, register
from .fsdp2 import broadcast_from_rank0
from .layout import describe_params, make_layout
from .meshes import make_mesh

__all__ = ["PPStrategy", "PipelinePrepared", "schedule_order"]


def schedule_order(schedule, stage_idx: int) -> list[list]:
    """torch's description of the schedule's compute on this stage (``pipeline_order``, idle
    slots and gradient reductions left out): ``[["F" | "B", microbatch], ...]``.

    Kept beside what ran, not trusted for it: in torch 2.13 ``Schedule1F1B``'s description
    of the last stage starts at micro-batch 1 and ends at micro-batch m (which does not
    exist), while ``_step_microbatches`` runs 0..m-1 correctly.
    """
    order = getattr(schedule, "pipeline_order", None) or {}
    out = []
    for action in order.get(stage_idx, []):
        if action is None or action.microbatch_index is None:
            continue
        kind = action.computation_type.value
        if kind in ("F", "B"):
            out.append([kind, int(action.microbatch_index)])
    return out


class PipelinePrepared(Prepared):
    """``last_run``: the latest step as it ran on this stage, for the schedule picture:
    ``{"stage", "n_stages", "schedule", "microbatches", "wall_start", "duration", "torch_order",
    "blocks": [["F" | "B", microbatch, start s, end s]]}`` (times from the step's start;
    each block is one ``forward_one_chunk`` / ``backward_one_chunk`` call of the stage)."""

    def __init__(self, *, schedule, stage_idx: int, n_stages: int, pp_group, last_rank: int, **kw):
        super().__init__(**kw)
        self.schedule = schedule
        self.stage_idx, self.n_stages = stage_idx, n_stages
        self.pp_group = pp_group
        self.last_rank = last_rank
        self.last_run: dict | None = None
        self._blocks: list | None = None
        stage = schedule._stage
        for kind, name in (("F", "forward_one_chunk"), ("B", "backward_one_chunk")):
            setattr(stage, name, self._timed(kind, getattr(stage, name)))

    def _timed(self, kind: str, fn):
        def timed(chunk_id, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(chunk_id, *args, **kwargs)
            finally:
                if self._blocks is not None:
                    self._blocks.append([kind, int(chunk_id), t0, time.perf_counter()])
        return timed

    @property
    def is_first(self) -> bool:
        return self.stage_idx == 0

    @property
    def is_last(self) -> bool:
        return self.stage_idx == self.n_stages - 1

    def train_step(self, batch) -> float:
        self.check()
        x, y = (t.to(self.device) for t in batch)
        mb = self.spec.microbatches
        if x.shape[0] % mb:
            raise PrepareError(f"batch of {x.shape[0]} does not split into pp_microbatches={mb}; use a batch size that is a multiple of {mb}")
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        self._blocks, t0, wall = [], time.perf_counter(), time.time()
        with self._autocast_ctx():
            if self.is_first and self.is_last:
                self.schedule.step(x, target=y, losses=losses)
            elif self.is_first:
                self.schedule.step(x)
            elif self.is_last:
                self.schedule.step(target=y, losses=losses)
            else:
                self.schedule.step()
        blocks, self._blocks = self._blocks, None
        self.last_run = {"stage": self.stage_idx, "n_stages": self.n_stages, "schedule": self.spec.pp_schedule,
                         "microbatches": mb, "wall_start": wall, "duration": time.perf_counter() - t0,
                         "torch_order": schedule_order(self.schedule, self.stage_idx),
                         "blocks": [[k, i, a - t0, b - t0] for k, i, a, b in blocks]}
        self.optimizer.step()
        self.steps += 1
        loss = torch.stack([l.detach().float() for l in losses]).mean() if losses else torch.zeros(())
        if self.n_stages > 1:
            dist.broadcast(loss, src=self.last_rank, group=self.pp_group)
        return float(loss)

    @torch.no_grad()
    def eval_loss(self, batch) -> float:
        raise PrepareError("eval_loss is not implemented for pipeline parallel; use train_step's loss, or a 'none' copy")


@register
class PPStrategy:
    kind = "pp"

    def apply(self, model, optimizer, ctx: Context) -> Prepared:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        s = ctx.spec
        if not hasattr(model, "keep_stage"):
            raise PrepareError(f"{type(model).__name__} has no keep_stage(); pipeline parallel needs a model split by layers (workbench.models.GPT)")
        mesh = make_mesh(ctx, (s.pp,), ("pp",))
        group = mesh.get_group("pp")
        stage_idx = mesh.get_local_rank("pp")
        broadcast_from_rank0(model)
        total_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        owned = model.pipeline_split_points(s.pp)[stage_idx]
        model.keep_stage(stage_idx, s.pp)
        apply_activation_checkpointing(model, s.activation_checkpointing, ctx.notes)
        model.to(ctx.device)
        stage = PipelineStage(model, stage_idx, s.pp, ctx.device, group=group)
        sched_cls = ScheduleGPipe if s.pp_schedule == "gpipe" else Schedule1F1B
        loss_fn = ctx.loss_fn
        schedule = sched_cls(stage, n_microbatches=s.microbatches, loss_fn=loss_fn)
        opt = build_optimizer(model, optimizer, ctx.notes)
        ctx.notes.append(f"pipeline stage {stage_idx}/{s.pp} owns layers {owned}"
                         + (" + embedding" if stage_idx == 0 else "")
                         + (" + norm/output" if stage_idx == s.pp - 1 else "")
                         + f"; schedule {s.pp_schedule}, {s.microbatches} microbatches")
        params = describe_params(model, 1, default_placement=f"Stage({stage_idx})")
        last_rank = dist.get_global_rank(group, s.pp - 1) if s.pp > 1 else ctx.rank
        layout = make_layout(strategy=self.kind, path="native", mesh_shape=mesh.shape, dim_names=("pp",),
                             rank=ctx.rank, world_size=ctx.world_size, params=params, notes=ctx.notes,
                             dp_rank=0, dp_size=1, param_bytes_global=total_bytes)
        return PipelinePrepared(
            schedule=schedule, stage_idx=stage_idx, n_stages=s.pp, pp_group=group, last_rank=last_rank,
            model=model, optimizer=opt, layout=layout, spec=s, ctx=ctx, mesh=mesh, loss_group=None,
            dp_rank=0, dp_size=1, inner=model,
            autocast_dtype=None if s.param_dtype == "fp32" else TORCH_DTYPES[s.param_dtype],
        )
