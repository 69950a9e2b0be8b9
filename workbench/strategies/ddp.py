"""DistributedDataParallel (Li et al. 2020, "PyTorch Distributed", VLDB): full replicas,
gradients all-reduced in buckets overlapping backward. Also ``none``: no parallelism.
Its naive form, for teaching, is in docs/strategies.md."""

from __future__ import annotations

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .base import TORCH_DTYPES, Context, Prepared, build_optimizer, register
from .layout import flat_layout

__all__ = ["apply_ddp", "NoStrategy"]


def apply_ddp(model, ctx: Context, group) -> DDP:
    """Wrap in DDP over ``group`` (the ``dp_replicate`` mesh dimension)."""
    ddp = DDP(model, process_group=group, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None)
    ctx.notes.append(f"DDP over {dist.get_world_size(group)} rank(s): full replica per rank, gradients all-reduced")
    if ctx.spec.param_dtype != "fp32":
        ctx.notes.append(f"autocast {ctx.spec.param_dtype}: fp32 master weights, fp32 gradient all-reduce")
    return ddp


@register
class NoStrategy:
    """Every rank trains its own full copy on its own data; nothing is communicated."""

    kind = "none"

    def apply(self, model, optimizer, ctx: Context) -> Prepared:
        from .blocks import apply_activation_checkpointing, apply_compile, find_blocks
        from .float8 import apply_fp8, check_fp8, mark_fp8_layout

        s = ctx.spec
        if s.activation_checkpointing != "none" or s.compile or s.cuda_graphs or s.fp8 != "none":
            blocks = find_blocks(model, ctx.hints.blocks, purpose="activation checkpointing / compile / fp8")
            if s.fp8 != "none":  # checked in prepare already: this only names the linears
                apply_fp8(model, s, check_fp8(model, s, blocks, 1, None, ctx.device), False, ctx.notes)
            apply_activation_checkpointing(blocks, s.activation_checkpointing, ctx.notes)
            if s.compile or s.cuda_graphs:
                apply_compile(blocks, ctx.notes, mode="reduce-overhead" if s.cuda_graphs else None)
        opt = build_optimizer(model, optimizer, ctx.notes)
        if ctx.world_size > 1:
            ctx.notes.append(f"no parallelism: {ctx.world_size} independent copies, losses not averaged")
        layout = flat_layout(ctx, strategy=self.kind, path="native", module=model, data_parallel=False)
        if s.fp8 != "none":
            mark_fp8_layout(layout, model, s)
        return Prepared(
            model=model,
            optimizer=opt,
            layout=layout,
            spec=s,
            ctx=ctx,
            autocast_dtype=None if s.param_dtype == "fp32" else TORCH_DTYPES[s.param_dtype],
        )
