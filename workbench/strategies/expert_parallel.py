"""Expert parallel (``ep``) for the workbench's MoE layers, through ``prepare``.

As in torchtitan, ``ep`` borrows ranks from ``dp_shard`` (laid out ``dp_shard_mod_ep x ep``):
experts are split over ``ep``, tokens travelling to their expert's rank and back over two
``all_to_all_single`` calls (GShard, Lepikhin et al. 2020), and FSDP2 shards them again over
``dp_shard_mod_ep``; every other weight is FSDP2-sharded over all of ``dp_shard``, as without ep."""

from __future__ import annotations

import torch
from torch import nn

from .base import PrepareError
from .hf_experts import is_fused_experts, listed_experts, shard_fused_experts, split_experts_problem

__all__ = ["moe_layers", "expert_modules", "check_ep_model", "apply_ep", "shard_experts", "EXPERT_WEIGHTS"]

EXPERT_WEIGHTS = ("w1", "w2", "w3")
SUPPORTED = (
    "workbench.models.MoE layers (MoEGPT) and transformers' fused experts modules "
    "(Qwen3-MoE, Qwen2-MoE, Mixtral, OLMoE: stacked gate_up_proj / down_proj)"
)


def moe_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from workbench.models.moe import MoE

    return [(n, m) for n, m in model.named_modules() if isinstance(m, MoE)]


def expert_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every module ep splits: workbench MoE layers, then transformers fused experts."""
    return moe_layers(model) + [(n, m) for n, m in model.named_modules() if is_fused_experts(m)]


def _n_experts(m: nn.Module) -> int:
    return m.n_experts if hasattr(m, "n_experts") else m.num_experts


def check_ep_model(model: nn.Module, ep: int) -> None:
    """Refuse, before any rank changes, a model whose experts cannot be split ``ep`` ways."""
    layers, fused = moe_layers(model), [(n, m) for n, m in model.named_modules() if is_fused_experts(m)]
    if not layers and not fused:
        listed = listed_experts(model)
        if listed:
            raise PrepareError(
                f"ep={ep}: {type(model).__name__} keeps its experts as separate modules ({listed[0]} is a "
                f"list of {len(model.get_submodule(listed[0]))}); expert parallel splits stacked expert "
                f"weights: {SUPPORTED}. Use ep=1 for this model (fsdp2 shards it)"
            )
        raise PrepareError(
            f"ep={ep}: {type(model).__name__} has no experts (no workbench.models.MoE layer and no "
            f"transformers experts module); expert parallel splits the experts of {SUPPORTED}. Use ep=1 "
            "for this model (dp_shard / tp / pp split dense models)"
        )
    bad = [f"{n} ({m.n_experts} experts)" for n, m in layers if m.n_experts % ep]
    if bad:
        n_exp = layers[0][1].n_experts
        raise PrepareError(
            f"ep={ep} does not divide the experts of {', '.join(bad)}; use ep in "
            f"{[d for d in range(2, n_exp + 1) if n_exp % d == 0]}"
        )
    done = [n for n, m in layers if m.ep_group is not None]
    if done:
        raise PrepareError(
            f"{done[0]} is already split by workbench.models.expert_parallel(); pass the model "
            "with all its experts to prepare(..., 'ep=N'), which splits them itself"
        )
    for n, m in fused:
        problem = split_experts_problem(n, m, ep)
        if problem:
            raise PrepareError(problem)


@torch.no_grad()
def apply_ep(model: nn.Module, mesh, notes: list[str]) -> int:
    """Keep this rank's experts, as ``Shard(0)`` DTensors on ``mesh["ep"]``; route tokens
    over the ep group. Weights must already be equal on every rank (broadcast from rank 0)."""
    from torch.distributed.tensor import DTensor, Shard

    ep_mesh = mesh["ep"]
    ep, rank = ep_mesh.size(), ep_mesh.get_local_rank()
    layers = expert_modules(model)
    e = _n_experts(layers[0][1])
    for _, m in layers:
        if not hasattr(m, "n_experts"):  # transformers fused experts
            shard_fused_experts(m, ep_mesh)
            continue
        n = m.n_experts // ep
        for name in EXPERT_WEIGHTS:
            full = getattr(m, name)
            local = full[rank * n : (rank + 1) * n].detach().clone()
            setattr(m, name, nn.Parameter(DTensor.from_local(local, ep_mesh, [Shard(0)], run_check=False)))
        m.ep_group = ep_mesh.get_group()
    notes.append(
        f"expert parallel over ep={ep}: {len(layers)} MoE layers ({type(layers[0][1]).__name__}), experts "
        f"{rank * (e // ep)}-{(rank + 1) * (e // ep) - 1} of {e} on this rank; tokens dispatched and combined "
        "by all_to_all_single"
    )
    return len(layers)


def shard_experts(model: nn.Module, mesh, dp_mesh, spec, dp_size: int, notes: list[str]) -> None:
    """FSDP2 units for the MoE layers, before the blocks': the router over ``dp_mesh`` (it is
    an ordinary weight), the experts over ``dp_shard_mod_ep`` with the gradient divided by
    the whole data-parallel size: an expert's gradient already sums the tokens its ep group
    sent it, so the step equals the mean over every data-parallel rank, as for the others."""
    from torch.distributed.fsdp import fully_shard

    efsdp = mesh["dp_shard_mod_ep"]
    for _, m in expert_modules(model):
        if hasattr(m, "router"):  # a workbench MoE holds its router: an ordinary weight, over all of dp_shard
            fully_shard(m.router, mesh=dp_mesh, reshard_after_forward=spec.reshard_after_forward)
        fully_shard(m, mesh=efsdp, reshard_after_forward=spec.reshard_after_forward)
        m.set_gradient_divide_factor(float(dp_size))
        if efsdp.size() > 1:
            # sum, then divide: gloo has no PREMUL_SUM. Not on one rank, where torch 2.13's
            # foreach_reduce divides by the factor in its copy and then again after it.
            m.set_force_sum_reduction_for_comms(True)
    notes.append(
        f"experts FSDP2-sharded over dp_shard_mod_ep={efsdp.size()} (gradient divided by dp_shard={dp_size}); "
        "routers and the rest over dp_shard"
    )
