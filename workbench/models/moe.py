"""Mixture-of-experts GPT: top-k router, capacity dropping, load-balancing loss, and
expert parallelism over ``all_to_all_single``.

GShard (Lepikhin et al. 2020, arXiv:2006.16668): top-2 gating, expert capacity, dropped
tokens riding the residual. Switch Transformer (Fedus et al. 2021, arXiv:2101.03961, eq.
4-6): the auxiliary loss ``E * sum_e f_e * P_e``, 1 under uniform routing."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import MoEConfig
from .gpt import GPT, Block

__all__ = ["Router", "MoE", "MoEGPT", "route", "expert_parallel", "load_balancing_loss"]


def load_balancing_loss(probs: torch.Tensor, expert_idx: torch.Tensor, n_experts: int) -> torch.Tensor:
    """Switch/GShard auxiliary loss ``E * sum_e f_e * P_e`` (1.0 when perfectly balanced).

    probs: ``[T, E]`` router softmax; expert_idx: ``[T, k]`` chosen experts. ``f_e`` counts
    all k assignments of each token (divided by k), so the loss is 1 at perfect balance for
    top-k too; ``P_e`` is the mean router probability of expert ``e``.
    """
    k = expert_idx.shape[1]
    counts = torch.zeros(n_experts, device=probs.device, dtype=probs.dtype)
    counts.scatter_add_(0, expert_idx.reshape(-1), torch.ones_like(expert_idx.reshape(-1), dtype=probs.dtype))
    f = counts / (expert_idx.shape[0] * k)  # no gradient, as in the papers
    p = probs.mean(0)
    return n_experts * (f * p).sum()


def route(probs: torch.Tensor, top_k: int, capacity: int):
    """Top-k routing with capacity dropping (GShard's priority: all first choices, then
    all second choices, each in token order).

    Returns ``(expert_idx[T,k], gate[T,k], keep[T,k] bool)``; gates of kept slots are
    renormalised over the token's k choices (before dropping, as in Mixtral).
    """
    gate, idx = probs.topk(top_k, dim=-1)
    gate = gate / gate.sum(-1, keepdim=True)
    n_experts = probs.shape[-1]
    keep = torch.zeros_like(idx, dtype=torch.bool)
    filled = torch.zeros(n_experts, dtype=torch.long, device=probs.device)
    for j in range(top_k):
        onehot = F.one_hot(idx[:, j], n_experts)  # [T, E]
        pos = (onehot.cumsum(0) - 1 + filled) * onehot  # queue position in chosen expert
        keep[:, j] = pos.sum(-1) < capacity
        filled = filled + onehot.sum(0)
    return idx, gate, keep


class Router(nn.Module):
    def __init__(self, dim: int, n_experts: int):
        super().__init__()
        self.gate = nn.Linear(dim, n_experts, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.gate(x).float(), dim=-1)


class MoE(nn.Module):
    """SwiGLU experts with stacked weights ``w1/w3 [E, dim, hidden]``, ``w2 [E, hidden, dim]``.

    After :func:`expert_parallel` the stacked weights hold only this rank's experts and
    tokens travel to their expert's rank and back over two ``all_to_all_single`` calls.
    """

    def __init__(self, dim: int, hidden: int, cfg: MoEConfig):
        super().__init__()
        self.n_experts, self.top_k = cfg.n_experts, cfg.top_k
        self.capacity_factor = cfg.capacity_factor
        self.router = Router(dim, cfg.n_experts)
        self.w1 = nn.Parameter(torch.randn(cfg.n_experts, dim, hidden) * 0.02)
        self.w3 = nn.Parameter(torch.randn(cfg.n_experts, dim, hidden) * 0.02)
        self.w2 = nn.Parameter(torch.randn(cfg.n_experts, hidden, dim) * 0.02)
        self.ep_group = None  # set by expert_parallel()
        self.last_aux_loss: torch.Tensor | None = None
        self.last_dropped: float = 0.0

    def capacity(self, n_tokens: int) -> int:
        return max(1, math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_experts))

    def _local(self, name: str) -> torch.Tensor:
        """This rank's experts: under ``prepare(..., "ep=N")`` the stacked weights are
        ``Shard(0)`` DTensors over the ep group; the math runs on their local part."""
        w = getattr(self, name)
        return w.to_local() if hasattr(w, "to_local") else w

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = self._local("w1"), self._local("w2"), self._local("w3")
        return (F.silu(x @ w1[e]) * (x @ w3[e])) @ w2[e]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        xt = x.reshape(-1, shape[-1])
        probs = self.router(xt)
        idx, gate, keep = route(probs, self.top_k, self.capacity(xt.shape[0]))
        self.last_aux_loss = load_balancing_loss(probs, idx, self.n_experts)
        self.last_dropped = float((~keep).float().mean())
        tok = torch.arange(xt.shape[0], device=x.device)[:, None].expand_as(idx)
        tok, exp, g = tok[keep], idx[keep], gate[keep].to(x.dtype)
        # y is a fresh tensor filled through its [T, dim] view (returning a view of it would
        # make FSDP2 warn about a unit whose output is a view)
        y = x.new_zeros(shape)
        yt = y.view(-1, shape[-1])
        if self.ep_group is None:
            for e in range(self.n_experts):
                sel = exp == e
                if sel.any():
                    t = tok[sel]
                    yt.index_add_(0, t, self._expert(e, xt[t]) * g[sel, None])
        else:
            order = torch.argsort(exp, stable=True)
            tok, exp, g = tok[order], exp[order], g[order]
            counts = torch.bincount(exp, minlength=self.n_experts)
            out = _ep_dispatch(xt[tok], counts, self, self.ep_group)
            yt.index_add_(0, tok, out * g[:, None])
        return y


def _ep_dispatch(tokens: torch.Tensor, counts: torch.Tensor, moe: MoE, group) -> torch.Tensor:
    """Send each token to the rank holding its expert, run the local experts, send back.

    ``tokens`` are sorted by global expert id, ``counts[E]`` per expert. Experts are laid
    out contiguously: rank r holds experts ``r*E_local .. (r+1)*E_local - 1``.
    """
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_to_all_single

    world = dist.get_world_size(group)
    e_local = moe.n_experts // world
    # 1. exchange counts: recv[r, j] = tokens rank r sends to my local expert j
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    recv_counts = recv_counts.view(world, e_local)
    send_splits = counts.view(world, e_local).sum(1).tolist()
    recv_splits = recv_counts.sum(1).tolist()
    # 2. dispatch (autograd-aware all-to-all)
    recv = tokens.new_empty(sum(recv_splits), tokens.shape[-1])
    recv = all_to_all_single(recv, tokens, recv_splits, send_splits, group=group)
    # 3. local experts: chunks ordered (source rank, local expert)
    pieces, offset = [], 0
    for r in range(world):
        for j in range(e_local):
            n = int(recv_counts[r, j])
            chunk = recv[offset : offset + n]
            pieces.append(moe._expert(j, chunk) if n else chunk)
            offset += n
    done = torch.cat(pieces) if pieces else recv
    # 4. combine: send results back along the reversed splits
    back = tokens.new_empty(tokens.shape[0], done.shape[-1])
    return all_to_all_single(back, done, send_splits, recv_splits, group=group)


@torch.no_grad()
def expert_parallel(model: nn.Module, group=None) -> nn.Module:
    """Keep only this rank's experts in every :class:`MoE` of ``model`` and route tokens
    over ``group`` (default: the default process group). Works at world size 1."""
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    for m in model.modules():
        if isinstance(m, MoE):
            if m.n_experts % world:
                raise ValueError(f"{m.n_experts} experts cannot be split over {world} ranks")
            e_local = m.n_experts // world
            sl = slice(rank * e_local, (rank + 1) * e_local)
            for name in ("w1", "w2", "w3"):
                setattr(m, name, nn.Parameter(getattr(m, name)[sl].clone()))
            m.ep_group = group if group is not None else dist.group.WORLD
    return model


class MoEGPT(GPT):
    """GPT whose every ``moe_every``-th block has an :class:`MoE` feed-forward."""

    def __init__(self, cfg: MoEConfig):
        self.moe_cfg = cfg
        super().__init__(cfg.gpt)

    def _make_block(self, i: int) -> nn.Module:
        if i % self.moe_cfg.moe_every == 0:
            return Block(self.cfg, MoE(self.cfg.dim, self.cfg.hidden_dim, self.moe_cfg))
        return Block(self.cfg)

    def aux_loss(self) -> torch.Tensor | None:
        terms = [m.last_aux_loss for m in self.modules() if isinstance(m, MoE) and m.last_aux_loss is not None]
        if not terms:
            return None
        return self.moe_cfg.aux_loss_coef * torch.stack(terms).sum()

    def _ffn_tp_plan(self, prefix: str, ffn: nn.Module, sp: bool) -> dict:
        if not isinstance(ffn, MoE):
            return super()._ffn_tp_plan(prefix, ffn, sp)
        # Experts stay whole on every TP rank (shard them with expert_parallel instead).
        # Under sequence parallel each TP rank would route different tokens and the
        # replicated expert gradients would diverge, so that combination is refused.
        if sp:
            raise ValueError("MoE blocks with tensor parallel need sequence_parallel=False")
        return {}
