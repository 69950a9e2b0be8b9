"""FSDP2: ``fully_shard`` each block, then the root (Zhao et al. 2023, "PyTorch FSDP";
ZeRO, Rajbhandari et al. 2020).

Parameters are DTensors sharded over ``dp_shard`` (replicated over ``dp_replicate`` for
HSDP), each block's all-gathered around its forward and backward, gradients
reduce-scattered; the naive form, for teaching, is in docs/strategies.md."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from .base import TORCH_DTYPES, Prepared, PrepareError, check_optimizer_matches

__all__ = ["apply_fsdp", "FSDP2Prepared", "broadcast_from_rank0", "fsdp_no_sync"]


@torch.no_grad()
def broadcast_from_rank0(model: nn.Module) -> None:
    """Make every rank's full (unsharded) weights equal to rank 0's before sharding:
    ``fully_shard`` keeps each rank's own slice, so different seeds would silently mix."""
    if dist.get_world_size() == 1:
        return
    for t in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(t.data, src=0)


def apply_fsdp(model: nn.Module, blocks: list[nn.Module], mesh, spec, notes: list[str]) -> nn.Module:
    """``fully_shard`` every block, then the root (torchtitan order). ``mesh`` is 1-D
    (``dp_shard``: FSDP2) or 2-D (``dp_replicate, dp_shard``: HSDP)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    mp = MixedPrecisionPolicy(
        param_dtype=None if spec.param_dtype == "fp32" else TORCH_DTYPES[spec.param_dtype],
        reduce_dtype=TORCH_DTYPES[spec.reduce] if spec.param_dtype != "fp32" or spec.reduce != "fp32" else None,
    )
    offload = CPUOffloadPolicy() if spec.cpu_offload else OffloadPolicy()
    for block in blocks:
        fully_shard(
            block, mesh=mesh, reshard_after_forward=spec.reshard_after_forward, mp_policy=mp, offload_policy=offload
        )
    # the root keeps its parameters gathered into backward, which starts with them (torch's
    # default for a root): resharding it too costs one more all-gather a step (benchmarks/FINDINGS.md)
    root_reshard = None if spec.reshard_after_forward else False
    fully_shard(model, mesh=mesh, reshard_after_forward=root_reshard, mp_policy=mp, offload_policy=offload)
    hsdp = mesh.ndim == 2
    notes.append(
        f"fully_shard on {len(blocks)} blocks + root"
        + (f" (HSDP: replicate over {mesh.size(0)} groups, shard over {mesh.size(1)} ranks)" if hsdp else "")
        + f"; reshard_after_forward={spec.reshard_after_forward} "
        f"({'ZeRO-3-like; the root keeps its gathered parameters for backward' if spec.reshard_after_forward else 'ZeRO-2-like'}); "
        f"param_dtype={spec.param_dtype}, reduce_dtype={spec.reduce}"
        + ("; optimizer state and parameters offloaded to CPU" if spec.cpu_offload else "")
    )
    return model


@contextlib.contextmanager
def fsdp_no_sync(model):
    """FSDP2's way to skip the gradient reduce-scatter of an accumulation micro-batch."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


class FSDP2Prepared(Prepared):
    reduce_scatter = True  # FSDP2 reduce-scatters gradients (an all-reduce of the full buffer on gloo)

    def no_sync(self):
        return fsdp_no_sync(self.model)

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
            raise PrepareError(
                f"rank {self.layout['rank']}: FSDP2 parameters are not sharded after reshard(); re-run prepare()"
            )
