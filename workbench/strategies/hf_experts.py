"""Expert parallel for Hugging Face MoE models: transformers' fused experts modules.

transformers 5 keeps a MoE layer's experts as one module of stacked 3-D weights
(``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``). Under ``ep`` each rank keeps its
``E / ep`` experts at their global shapes (so a checkpoint reshards), and the module's
forward becomes a dispatch to the experts' ranks and back (as transformers' ``AllToAllEP``)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

__all__ = ["is_fused_experts", "split_experts_problem", "listed_experts", "shard_fused_experts"]


def is_fused_experts(m: nn.Module) -> bool:
    """A transformers experts module (``@use_experts_implementation``: its forward takes
    ``(hidden_states, top_k_index, top_k_weights)``) with stacked expert weights."""
    if getattr(m, "_workbench_ep", None) is not None:  # split already: num_experts is the local count
        return True
    n = getattr(m, "num_experts", None)
    return (
        hasattr(m, "_is_expert_parallel")
        and isinstance(n, int)
        and any(p.dim() >= 2 and p.shape[0] == n for p in m.parameters(recurse=False))
    )


def listed_experts(model: nn.Module) -> list[str]:
    """Experts kept as a list of separate modules (``experts = nn.ModuleList([...])``):
    the older transformers layout, which ``ep`` does not split."""
    return [
        n
        for n, m in model.named_modules()
        if n.rsplit(".", 1)[-1] == "experts" and isinstance(m, (nn.ModuleList, nn.ModuleDict)) and len(m) > 1
    ]


def split_experts_problem(name: str, m: nn.Module, ep: int) -> str | None:
    """Why ``m`` cannot be split ``ep`` ways (``None`` when it can)."""
    e = m.num_experts
    if getattr(m, "_workbench_ep", None) is not None or m._is_expert_parallel:
        return f"{name} is already expert-parallel; pass the model with all its experts to prepare(..., 'ep=N')"
    if e % ep:
        return (
            f"ep={ep} does not divide the {e} experts of {name}; use ep in {[d for d in range(2, e + 1) if e % d == 0]}"
        )
    other = [n for n, p in m.named_parameters(recurse=False) if p.dim() < 2 or p.shape[0] != e]
    inner = [n for n, _ in m.named_parameters() if "." in n]
    if other or inner:
        return (
            f"{name} ({type(m).__name__}) holds parameters not stacked by expert ({', '.join(other + inner)}); "
            "ep splits modules whose every weight is [num_experts, ...]"
        )
    return None


@torch.no_grad()
def shard_fused_experts(m: nn.Module, ep_mesh) -> tuple[int, int]:
    """Keep this rank's experts of ``m`` as ``Shard(0)`` DTensors on ``ep_mesh`` and route its
    tokens over the ep group; returns ``(first, last)`` global expert ids held here."""
    from torch.distributed.tensor import DTensor, Shard

    ep, rank = ep_mesh.size(), ep_mesh.get_local_rank()
    e = m.num_experts
    n = e // ep
    for name, p in list(m.named_parameters(recurse=False)):
        local = p[rank * n : (rank + 1) * n].detach().clone()
        dt = DTensor.from_local(local, ep_mesh, [Shard(0)], run_check=False)
        setattr(m, name, nn.Parameter(dt, requires_grad=p.requires_grad))
    own_forward = m.forward
    m.num_experts = n  # the module's own forward runs on local expert ids
    m._workbench_ep = (e, ep)
    group = ep_mesh.get_group()

    def forward(hidden_states, top_k_index, top_k_weights):
        return _dispatch(m, own_forward, hidden_states, top_k_index, top_k_weights, group, ep, n)

    m.forward = forward
    return rank * n, (rank + 1) * n - 1


@contextlib.contextmanager
def _local_params(m: nn.Module):
    """The module's own forward indexes plain tensors: its DTensor weights as their local part
    for the call (``to_local`` is differentiable: gradients reach the DTensors)."""
    from torch.distributed.tensor import DTensor

    originals = {n: p for n, p in m.named_parameters(recurse=False) if isinstance(p, DTensor)}
    for n, p in originals.items():
        m._parameters[n] = p.to_local()
    try:
        yield
    finally:
        m._parameters.update(originals)


def _dispatch(m, own_forward, hidden, top_k_index, top_k_weights, group, ep: int, n_local: int):
    """Every (token, slot) pair to its expert's rank and back, weighted here by the router:
    on the expert's rank it runs through the module's own forward (local expert ids, unit
    weights, ``num_experts`` the local count)."""
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_to_all_single

    if hasattr(hidden, "to_local"):
        hidden = hidden.to_local()
    n_tokens, k = top_k_index.shape
    ids = top_k_index.reshape(-1)
    order = torch.argsort(ids, stable=True)  # by expert, so by the rank that holds it
    send = hidden[order // k]
    counts = torch.bincount(ids, minlength=n_local * ep)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    send_sizes = counts.view(ep, n_local).sum(1).tolist()
    recv_sizes = recv_counts.view(ep, n_local).sum(1).tolist()
    recv = all_to_all_single(send.new_empty(sum(recv_sizes), send.shape[-1]), send, recv_sizes, send_sizes, group=group)
    # chunks arrive ordered (source rank, local expert): the local id of every row
    local_ids = torch.arange(n_local, device=recv.device).repeat(ep).repeat_interleave(recv_counts)
    with _local_params(m):
        if recv.shape[0]:
            out = own_forward(recv, local_ids[:, None], recv.new_ones(recv.shape[0], 1))
        else:  # nothing to run: one zero row keeps the experts in backward (FSDP2 reduces on every rank)
            out = own_forward(recv.sum(0, keepdim=True), local_ids.new_zeros(1, 1), recv.new_ones(1, 1))[:0]
    back = all_to_all_single(out.new_empty(send.shape[0], out.shape[-1]), out, send_sizes, recv_sizes, group=group)
    slot = torch.empty_like(order)
    slot[order] = torch.arange(order.numel(), device=order.device)
    per_slot = back[slot].view(n_tokens, k, -1)
    return (per_slot * top_k_weights.unsqueeze(-1).to(per_slot.dtype)).sum(1).to(hidden.dtype)
