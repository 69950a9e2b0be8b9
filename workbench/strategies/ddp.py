"""DistributedDataParallel (Li et al. 2020, "PyTorch Distributed", VLDB): full replicas,
gradients all-reduced in buckets overlapping backward. Also ``none``: no parallelism.

Naive form, for teaching (what DDP does, minus bucketing and overlap)::

    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad); p.grad /= world_size
    optimizer.step()
"""
from __future__ import annotations

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .base import Context, Prepared, TORCH_DTYPES, apply_activation_checkpointing, apply_compile, build_optimizer, register
from .layout import describe_params, make_layout
from .meshes import make_mesh


def _autocast(ctx: Context):
    return None if ctx.spec.param_dtype == "fp32" else TORCH_DTYPES[ctx.spec.param_dtype]


@register
class DDPStrategy:
    kind = "ddp"

    def apply(self, model, optimizer, ctx: Context) -> Prepared:
        s = ctx.spec
        mesh = make_mesh(ctx, (ctx.world_size,), ("dp",))
        apply_activation_checkpointing(model, s.activation_checkpointing, ctx.notes)
        if s.compile:
            apply_compile(model, ctx.notes)
        ddp = DDP(model, process_group=mesh.get_group("dp"),
                  device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
        opt = build_optimizer(ddp, optimizer, ctx.notes)
        ctx.notes.append(f"DDP over {ctx.world_size} rank(s): full replica per rank, gradients all-reduced")
        if _autocast(ctx) is not None:
            ctx.notes.append(f"autocast {s.param_dtype}: fp32 master weights, fp32 gradient all-reduce")
        layout = make_layout(strategy=self.kind, path="native", mesh_shape=mesh.shape, dim_names=("dp",),
                             rank=ctx.rank, world_size=ctx.world_size, params=describe_params(model, 1),
                             notes=ctx.notes, dp_rank=ctx.rank, dp_size=ctx.world_size)
        return Prepared(model=ddp, optimizer=opt, layout=layout, spec=s, ctx=ctx, mesh=mesh,
                        loss_group=mesh.get_group("dp"), dp_rank=ctx.rank, dp_size=ctx.world_size,
                        inner=model, autocast_dtype=_autocast(ctx))


@register
class NoStrategy:
    """Every rank trains its own full copy on its own data; nothing is communicated."""

    kind = "none"

    def apply(self, model, optimizer, ctx: Context) -> Prepared:
        s = ctx.spec
        apply_activation_checkpointing(model, s.activation_checkpointing, ctx.notes)
        if s.compile:
            apply_compile(model, ctx.notes)
        opt = build_optimizer(model, optimizer, ctx.notes)
        if ctx.world_size > 1:
            ctx.notes.append(f"no parallelism: {ctx.world_size} independent copies, losses not averaged")
        layout = make_layout(strategy=self.kind, path="native", mesh_shape=(ctx.world_size,), dim_names=("dp",),
                             rank=ctx.rank, world_size=ctx.world_size, params=describe_params(model, 1),
                             notes=ctx.notes, dp_rank=0, dp_size=1)
        return Prepared(model=model, optimizer=opt, layout=layout, spec=s, ctx=ctx,
                        autocast_dtype=_autocast(ctx))
