"""Model configurations: frozen, keyword-only dataclasses with size presets.

A config is also the schema of a widget form, so every field is a plain
int/float/bool and nothing reads the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["GPTConfig", "MoEConfig"]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """A GPT/Llama-style decoder: RMSNorm, RoPE, SwiGLU, causal attention with GQA."""

    vocab: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: same as n_heads (plain multi-head attention)
    ffn_dim: int | None = None  # None: Llama's 8/3 * dim rounded up to a multiple of 16
    max_seq_len: int = 64
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if (self.dim // self.n_heads) % 2:
            raise ValueError(f"head_dim={self.dim // self.n_heads} must be even for RoPE")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.kv_heads}")
        if self.n_layers < 1:
            raise ValueError(f"n_layers={self.n_layers} must be >= 1")

    # Resolved values -------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def hidden_dim(self) -> int:
        if self.ffn_dim is not None:
            return self.ffn_dim
        h = int(8 * self.dim / 3)
        return 16 * ((h + 15) // 16)

    def with_(self, **changes) -> GPTConfig:
        """A copy with some fields changed (``cfg.with_(n_layers=4)``)."""
        return replace(self, **changes)

    def num_params(self) -> int:
        """Parameter count computed from the config alone (matches ``GPT(cfg)``)."""
        d, h, L = self.dim, self.hidden_dim, self.n_layers
        kv = self.kv_heads * self.head_dim
        attn = d * d + 2 * d * kv + d * d
        ffn = 3 * d * h
        per_layer = attn + ffn + 2 * d
        emb = self.vocab * d
        out = 0 if self.tie_embeddings else self.vocab * d
        return emb + L * per_layer + d + out

    # Presets ---------------------------------------------------------------------------
    @classmethod
    def tiny(cls, **kw) -> GPTConfig:
        """~50k parameters: runs 20 steps in well under a second on one CPU core."""
        base = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
        return cls(**{**base, **kw})

    @classmethod
    def small(cls, **kw) -> GPTConfig:
        """~3M parameters: a few minutes of CPU training learns to spell English."""
        base = dict(dim=256, n_layers=4, n_heads=8, n_kv_heads=4, max_seq_len=256)
        return cls(**{**base, **kw})

    @classmethod
    def m100(cls, **kw) -> GPTConfig:
        """~100M parameters (GPT-2-small-like widths, Llama block)."""
        base = dict(dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=3072, max_seq_len=1024)
        return cls(**{**base, **kw})

    @classmethod
    def b1(cls, **kw) -> GPTConfig:
        """~1B parameters (Llama-3.2-1B-like widths with a byte vocabulary)."""
        base = dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, max_seq_len=2048)
        return cls(**{**base, **kw})


@dataclass(frozen=True, kw_only=True)
class MoEConfig:
    """A GPT whose feed-forward layers are a mixture of SwiGLU experts.

    ``capacity_factor`` bounds tokens per expert at ``ceil(cf * tokens * top_k / n_experts)``;
    tokens past capacity are dropped (they pass through the residual only), as in GShard
    (Lepikhin et al. 2020) and Switch Transformer (Fedus et al. 2021).
    """

    gpt: GPTConfig = GPTConfig()
    n_experts: int = 4
    top_k: int = 2
    capacity_factor: float = 1.25
    aux_loss_coef: float = 0.01
    moe_every: int = 1  # every n-th block is MoE (1: all of them)

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k={self.top_k} must be in 1..n_experts={self.n_experts}")
        if self.capacity_factor <= 0:
            raise ValueError(f"capacity_factor={self.capacity_factor} must be > 0")

    @classmethod
    def tiny(cls, **kw) -> MoEConfig:
        return cls(**{"gpt": GPTConfig.tiny(), "n_experts": 4, **kw})

    # Pass-through so code written against GPTConfig also reads an MoEConfig.
    def __getattr__(self, name):
        if name == "gpt":
            raise AttributeError(name)
        return getattr(self.gpt, name)
