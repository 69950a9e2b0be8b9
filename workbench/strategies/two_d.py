"""2-D parallelism: FSDP2 over ``dp_shard`` x tensor parallel over ``tp`` on one named
mesh (torchtitan's order: TP first, then activation checkpointing, compile, FSDP).

TP runs inside a node-like group (fast, frequent collectives); FSDP shards the
TP-sharded parameters again across the data-parallel groups.
"""
from __future__ import annotations

from .base import Context, Prepared, apply_activation_checkpointing, apply_compile, register
from .fsdp2 import broadcast_from_rank0, finish_fsdp, shard_model
from .meshes import make_mesh
from .tensor_parallel import apply_tp

__all__ = ["FSDP2TPStrategy"]


@register
class FSDP2TPStrategy:
    kind = "fsdp2_tp"

    def apply(self, model, optimizer, ctx: Context) -> Prepared:
        s = ctx.spec
        names = ("dp_shard", "tp")
        mesh = make_mesh(ctx, (s.dp_shard, s.tp), names)
        broadcast_from_rank0(model)
        apply_tp(model, mesh["tp"], s.sequence_parallel, ctx.notes)
        apply_activation_checkpointing(model, s.activation_checkpointing, ctx.notes)
        if s.compile:
            apply_compile(model, ctx.notes)
        shard_model(model, mesh["dp_shard"], s, ctx.notes)
        ctx.notes.append(f"2D: dp_shard={s.dp_shard} x tp={s.tp}; ranks in one row share a batch")
        return finish_fsdp(model, optimizer, ctx, mesh, strategy=self.kind, dim_names=names,
                           dp_dims=("dp_shard",), loss_group=mesh.get_group("dp_shard"))
