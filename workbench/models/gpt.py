"""A GPT/Llama-style decoder in plain torch (no torch.distributed at import).

Layout follows torchtitan's Llama so the parallelism modules can act on it by name:
``tok_embeddings`` -> ``layers`` (an ``nn.ModuleDict`` keyed "0".."L-1") -> ``norm`` ->
``output``. A pipeline stage deletes the layers it does not own and sets
``tok_embeddings`` / ``norm`` / ``output`` to ``None``; ``forward`` skips what is missing,
so the same class serves every stage.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import GPTConfig

__all__ = ["GPT", "RMSNorm", "Attention", "FeedForward", "Block", "precompute_rope", "apply_rope"]


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), as in Llama."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.type_as(x) * self.weight

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def precompute_rope(head_dim: int, max_seq_len: int, theta: float) -> torch.Tensor:
    """Rotary tables (Su et al. 2021) as a real tensor ``[seq, head_dim/2, 2]`` (cos, sin).

    Real rather than complex so that DTensor, FSDP and pipelining move it without fuss.
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    t = torch.arange(max_seq_len, dtype=torch.float32)
    ang = torch.outer(t, inv)
    return torch.stack([ang.cos(), ang.sin()], dim=-1)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate ``x[b, s, h, d]`` pairwise by the first ``s`` rows of ``rope``."""
    s = x.shape[1]
    cos, sin = rope[:s, :, 0], rope[:s, :, 1]  # [s, d/2]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    xf = x.float().reshape(*x.shape[:-1], -1, 2)
    x0, x1 = xf[..., 0], xf[..., 1]
    out = torch.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    """Causal grouped-query attention (Ainslie et al. 2023) over SDPA.

    Head counts are inferred from the projection outputs (``view(..., -1, head_dim)``), so
    after tensor-parallel column sharding each rank runs its local heads unchanged.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.n_rep = cfg.n_heads // cfg.kv_heads
        kv = cfg.kv_heads * cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, kv, bias=False)
        self.wv = nn.Linear(cfg.dim, kv, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)
        # Replaceable core ``(module, q, k, v) -> y`` on ``[b, heads, s, head_dim]``: context
        # parallel puts ring attention here; ``None`` is causal SDPA.
        self.attn_fn = None

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        if self.n_rep > 1:
            k = k.repeat_interleave(self.n_rep, dim=2)
            v = v.repeat_interleave(self.n_rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = (
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
            if self.attn_fn is None
            else self.attn_fn(self, q, k, v)
        )
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU (Shazeer 2020): ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm transformer block; ``feed_forward`` may be swapped for an MoE layer."""

    def __init__(self, cfg: GPTConfig, feed_forward: nn.Module | None = None):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = feed_forward or FeedForward(cfg.dim, cfg.hidden_dim)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), rope)
        return h + self.feed_forward(self.ffn_norm(h))


class GPT(nn.Module):
    """Decoder-only language model. ``forward(tokens[b, s]) -> logits[b, s, vocab]``.

    On a pipeline stage without ``tok_embeddings`` the input is the previous stage's
    hidden state ``[b, s, dim]``; without ``output`` the result is a hidden state.
    """

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleDict({str(i): self._make_block(i) for i in range(cfg.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output: nn.Linear | None = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # Non-persistent: recomputed, never checkpointed, never sharded.
        self.register_buffer("rope", precompute_rope(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta), persistent=False)
        # A constant every rank computes alike: DDP need not broadcast it from rank 0 before
        # every forward, which it does for any buffer (a visible share of a small step:
        # benchmarks/FINDINGS.md). DDP reads this attribute of the module it wraps.
        self._ddp_params_and_buffers_to_ignore = ("rope",)
        self.init_weights()

    def _make_block(self, i: int) -> nn.Module:
        return Block(self.cfg)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """GPT-2-style init: N(0, 0.02), output projections scaled by 1/sqrt(2 L)."""
        gen = None
        if seed is not None:
            gen = torch.Generator().manual_seed(seed)
        std_out = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                std = std_out if name.endswith(("wo.weight", "w2.weight")) else 0.02
                p.copy_(torch.randn(p.shape, generator=gen) * std)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``positions``: the global sequence positions of ``tokens``' columns (a context-
        parallel shard holds non-contiguous ones); ``None`` is ``0..s-1``."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        rope = self.rope if positions is None else self.rope[positions]
        for layer in self.layers.values():
            h = layer(h, rope)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

    def aux_loss(self) -> torch.Tensor | None:
        """Extra loss terms of the last forward (MoE load balancing); ``None`` here."""
        return None

    # Parallelism hooks ----------------------------------------------------------------
    def tp_plan(self, sequence_parallel: bool = True) -> dict:
        """The DTensor plan for ``parallelize_module`` (torchtitan's Llama plan).

        Column-parallel q/k/v and w1/w3, row-parallel wo and w2. With sequence parallel,
        the norms run on sequence shards (``Shard(1)``) and attention/MLP inputs are
        all-gathered on entry (Korthikanti et al. 2022). Logits come back replicated.
        """
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            RowwiseParallel,
            SequenceParallel,
        )

        sp = sequence_parallel
        act = Shard(1) if sp else Replicate()
        plan: dict = {}
        if self.tok_embeddings is not None:
            plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=act)
        if self.norm is not None and sp:
            plan["norm"] = SequenceParallel()
        if self.output is not None:
            plan["output"] = ColwiseParallel(input_layouts=act, output_layouts=Replicate())
        for key, block in self.layers.items():
            p = f"layers.{key}."
            if sp:
                plan[p + "attention_norm"] = SequenceParallel()
                plan[p + "ffn_norm"] = SequenceParallel()
                plan[p + "attention"] = PrepareModuleInput(
                    input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
                )
            plan[p + "attention.wq"] = ColwiseParallel()
            plan[p + "attention.wk"] = ColwiseParallel()
            plan[p + "attention.wv"] = ColwiseParallel()
            plan[p + "attention.wo"] = RowwiseParallel(output_layouts=act)
            plan.update(self._ffn_tp_plan(p + "feed_forward", block.feed_forward, sp))
        return plan

    def _ffn_tp_plan(self, prefix: str, ffn: nn.Module, sp: bool) -> dict:
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            RowwiseParallel,
        )

        plan: dict = {}
        if sp:
            plan[prefix] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan[prefix + ".w1"] = ColwiseParallel()
        plan[prefix + ".w3"] = ColwiseParallel()
        plan[prefix + ".w2"] = RowwiseParallel(output_layouts=Shard(1) if sp else Replicate())
        return plan

    def pipeline_split_points(self, n_stages: int) -> list[list[str]]:
        """Layer keys owned by each stage, balanced by count (stage 0 gets the embedding
        and the last stage the norm/output, so the first stages take the extra layers)."""
        keys = list(self.layers.keys())
        if not 1 <= n_stages <= len(keys):
            raise ValueError(f"{n_stages} pipeline stages for {len(keys)} layers: need 1..{len(keys)}")
        base, extra = divmod(len(keys), n_stages)
        out, start = [], 0
        for s in range(n_stages):
            n = base + (1 if s < extra else 0)
            out.append(keys[start : start + n])
            start += n
        return out

    def keep_stage(self, stage: int, n_stages: int) -> GPT:
        """Turn this model into pipeline stage ``stage`` in place (torchtitan style)."""
        owned = set(self.pipeline_split_points(n_stages)[stage])
        for key in list(self.layers.keys()):
            if key not in owned:
                del self.layers[key]
        if stage != 0:
            self.tok_embeddings = None
        if stage != n_stages - 1:
            self.norm = None
            self.output = None
        return self
