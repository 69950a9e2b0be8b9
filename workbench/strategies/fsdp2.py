"""FSDP2: ``fully_shard`` each block, then the root (Zhao et al. 2023, "PyTorch FSDP";
ZeRO, Rajbhandari et al. 2020).

Parameters become ``DTensor``s sharded on dim 0 over the ``dp_shard`` mesh dimension
(replicated over ``dp_replicate`` for HSDP). Each block's parameters are all-gathered
just before its forward and backward and freed after; gradients are reduce-scattered.
``reshard_after_forward=True`` frees gathered parameters after forward (ZeRO-3-like);
``False`` keeps them until backward (ZeRO-2-like: more memory, one all-gather fewer).

Naive form, for teaching (one block)::

    full = all_gather(shard)                 # forward: materialise the block
    y = block(x, full); del full
    full = all_gather(shard)                 # backward: again (if resharded)
    g_full = grad(...); g_shard = reduce_scatter(g_full) / world
    optimizer.step()                          # on the shard only
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .base import (
    Context, Prepared, PrepareError, TORCH_DTYPES, apply_activation_checkpointing, apply_compile,
    build_optimizer, check_optimizer_matches, register,
)
from .layout import describe_params, make_layout
from .meshes import dp_coords, make_mesh

__all__ = ["FSDP2Strategy", "shard_model", "FSDP2Prepared", "broadcast_from_rank0"]


@torch.no_grad()
def broadcast_from_rank0(model: nn.Module) -> None:
    """Make every rank's full (unsharded) weights equal to rank 0's before sharding:
    ``fully_shard`` keeps each rank's own slice, so different seeds would silently mix."""
    if dist.get_world_size() == 1:
        return
    for t in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(t.data, src=0)


def _blocks(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model, "layers", None)
    if layers is None:
        return []
    return list(layers.values()) if isinstance(layers, nn.ModuleDict) else list(layers)


def shard_model(model: nn.Module, mesh, spec, notes: list[str]) -> nn.Module:
    """``fully_shard`` every block of ``model.layers``, then the root (torchtitan order)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(
        param_dtype=None if spec.param_dtype == "fp32" else TORCH_DTYPES[spec.param_dtype],
        reduce_dtype=TORCH_DTYPES[spec.reduce] if spec.param_dtype != "fp32" or spec.reduce != "fp32" else None,
    )
    offload = CPUOffloadPolicy() if spec.cpu_offload else OffloadPolicy()
    blocks = _blocks(model)
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=spec.reshard_after_forward, mp_policy=mp, offload_policy=offload)
    fully_shard(model, mesh=mesh, reshard_after_forward=spec.reshard_after_forward, mp_policy=mp, offload_policy=offload)
    notes.append(
        f"fully_shard on {len(blocks)} blocks + root; reshard_after_forward={spec.reshard_after_forward} "
        f"({'ZeRO-3-like' if spec.reshard_after_forward else 'ZeRO-2-like'}); "
        f"param_dtype={spec.param_dtype}, reduce_dtype={spec.reduce}"
        + ("; optimizer state and parameters offloaded to CPU" if spec.cpu_offload else "")
    )
    return model


class FSDP2Prepared(Prepared):
    def reshard(self) -> None:
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import DTensor

        if not all(isinstance(p, DTensor) for p in self.model.parameters()):
            for m in self.model.modules():
                if isinstance(m, FSDPModule):
                    m.reshard()

    def check(self) -> None:
        """Re-shard modules left unsharded (a ``torch.no_grad()`` forward with
        ``reshard_after_forward=False`` never reaches the post-backward reshard), then verify
        the optimizer holds the model's sharded parameters."""
        from torch.distributed.tensor import DTensor

        self.reshard()
        check_optimizer_matches(self.model, self.optimizer, where=f"rank {self.layout['rank']}: ")
        if not all(isinstance(p, DTensor) for p in self.model.parameters()):
            raise PrepareError(f"rank {self.layout['rank']}: FSDP2 parameters are not sharded after reshard(); re-run prepare()")


def finish_fsdp(model, optimizer, ctx: Context, mesh, *, strategy: str, dim_names, dp_dims, loss_group) -> Prepared:
    opt = build_optimizer(model, optimizer, ctx.notes)
    check_optimizer_matches(model, opt, where=f"rank {ctx.rank}: ")
    dp_rank, dp_size = dp_coords(mesh, dp_dims)
    layout = make_layout(strategy=strategy, path="native", mesh_shape=mesh.shape, dim_names=dim_names,
                         rank=ctx.rank, world_size=ctx.world_size,
                         params=describe_params(model, len(dim_names)), notes=ctx.notes,
                         dp_rank=dp_rank, dp_size=dp_size)
    return FSDP2Prepared(model=model, optimizer=opt, layout=layout, spec=ctx.spec, ctx=ctx, mesh=mesh,
                         loss_group=loss_group, dp_rank=dp_rank, dp_size=dp_size, inner=model)


@register
class FSDP2Strategy:
    kind = "fsdp2"

    def apply(self, model, optimizer, ctx: Context) -> Prepared:
        s = ctx.spec
        if s.dp_replicate > 1:
            names = ("dp_replicate", "dp_shard")
            mesh = make_mesh(ctx, (s.dp_replicate, s.dp_shard), names)
            ctx.notes.append(f"HSDP: replicate over {s.dp_replicate} groups, shard over {s.dp_shard} ranks")
        else:
            names = ("dp_shard",)
            mesh = make_mesh(ctx, (s.dp_shard,), names)
        broadcast_from_rank0(model)
        apply_activation_checkpointing(model, s.activation_checkpointing, ctx.notes)
        if s.compile:
            apply_compile(model, ctx.notes)
        shard_model(model, mesh, s, ctx.notes)
        return finish_fsdp(model, optimizer, ctx, mesh, strategy=self.kind, dim_names=names,
                           dp_dims=names, loss_group=dist.group.WORLD)
