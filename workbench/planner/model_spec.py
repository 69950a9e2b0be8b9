"""What the planner needs to know about a transformer: its shape, not its weights.

`ModelSpec` is the one input every estimate starts from. Parameter counts follow the
Llama layout (pre-norm, RMSNorm weights only, no biases, grouped-query attention,
gated SwiGLU MLP), which also covers Mistral/Mixtral and most current open models.
The counts agree with the published sizes to within a fraction of a percent (Llama 3
70B: 70.55e9 here, "70B" in the model card).
"""

from __future__ import annotations

from dataclasses import dataclass

IMPLEMENTATIONS = ("megatron", "transformers")


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts of a model.

    `total` is what memory is paid for; `active` is what one token passes through
    (equal to `total` for a dense model, smaller for a mixture of experts with
    `top_k < experts`) and is the N of the 6N FLOPs rule.
    """

    total: int
    active: int
    embedding: int
    per_layer: int
    expert_per_layer: int


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """Shape of a decoder-only transformer (keyword-only, frozen).

    layers, hidden, heads, kv_heads (grouped-query attention; = heads for MHA), ffn
    (MLP inner width, per expert for MoE), vocab, seq_len (training sequence length),
    experts / top_k (MoE routing; 1/1 for a dense model), tied_embeddings (input and
    output embedding share one matrix), gated_mlp (SwiGLU: three matrices, not two),
    dropout (the block applies attention and residual dropout, whose masks the backward
    keeps: the GPT of Korthikanti et al. 2022 does; Llama-style pretraining does not).
    implementation: whose modules run the layer, which sets what its backward keeps
    (memory.saved_tensors): "megatron" (fused kernels, the paper's inventory) or
    "transformers" (Hugging Face's eager modules, as the workbench lays them out).
    """

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int
    experts: int = 1
    top_k: int = 1
    tied_embeddings: bool = False
    gated_mlp: bool = True
    dropout: bool = False
    name: str = "custom"
    implementation: str = "megatron"

    def __post_init__(self) -> None:
        for field in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "experts", "top_k"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelSpec.{field} must be a positive int, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(
                f"ModelSpec: hidden={self.hidden} is not divisible by heads={self.heads}; "
                f"head_dim must be whole (e.g. heads={_near_divisor(self.hidden, self.heads)})"
            )
        if self.heads % self.kv_heads:
            raise ValueError(
                f"ModelSpec: heads={self.heads} is not a multiple of kv_heads={self.kv_heads}; "
                "grouped-query attention shares each kv head among a whole number of heads"
            )
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(
                f"ModelSpec.implementation={self.implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}"
            )
        if self.top_k > self.experts:
            raise ValueError(
                f"ModelSpec: top_k={self.top_k} exceeds experts={self.experts}; use top_k <= {self.experts}"
            )

    # ----------------------------------------------------------------- shape helpers
    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    def attention_params_per_layer(self) -> int:
        """Q and O are hidden x hidden; K and V are hidden x (kv_heads * head_dim)."""
        kv = self.kv_heads * self.head_dim
        return 2 * self.hidden * self.hidden + 2 * self.hidden * kv

    def mlp_params_per_expert(self) -> int:
        """Gated (SwiGLU) MLP has gate, up and down matrices; a plain MLP has two."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.ffn

    def params(self) -> ParamCount:
        """Count parameters (Llama layout; norms are hidden-sized weight vectors).

        per layer = attention + experts * MLP + router (hidden x experts, MoE only)
                    + 2 norms; embedding = vocab x hidden, doubled when untied;
        plus one final norm.
        """
        norms = 2 * self.hidden
        router = self.hidden * self.experts if self.is_moe else 0
        expert = self.mlp_params_per_expert()
        per_layer = self.attention_params_per_layer() + self.experts * expert + router + norms
        active_layer = self.attention_params_per_layer() + self.top_k * expert + router + norms
        embedding = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        total = self.layers * per_layer + embedding + self.hidden
        active = self.layers * active_layer + embedding + self.hidden
        return ParamCount(
            total=total, active=active, embedding=embedding, per_layer=per_layer, expert_per_layer=self.experts * expert
        )

    def lora_params_per_layer(self, rank: int) -> tuple[int, int]:
        """(attention, MLP per expert) LoRA parameters of one layer at ``rank``: each matrix
        ``d_in x d_out`` gets ``A (r x d_in)`` and ``B (d_out x r)`` (peft's ``all-linear``)."""
        kv = self.kv_heads * self.head_dim
        h, f = self.hidden, self.ffn
        attention = rank * ((h + h) * 2 + (h + kv) * 2)  # q, o: h -> h; k, v: h -> kv
        mlp = rank * (h + f) * (3 if self.gated_mlp else 2)
        return attention, mlp

    # ----------------------------------------------------------------------- presets
    @classmethod
    def llama(cls, size: str, *, seq_len: int | None = None) -> ModelSpec:
        """Llama 3 / 3.1 shapes from the Meta model cards ("8b", "70b", "405b")."""
        key = size.lower().removeprefix("llama").removeprefix("-").removeprefix("3")
        key = key.removeprefix(".1").removeprefix("-")
        if key not in _LLAMA:
            raise ValueError(f"unknown Llama size {size!r}; known: {', '.join(_LLAMA)}")
        shape = dict(_LLAMA[key])
        if seq_len is not None:
            shape["seq_len"] = seq_len
        return cls(name=f"llama3-{key}", **shape)

    @classmethod
    def preset(cls, name: str, *, seq_len: int | None = None) -> ModelSpec:
        """Any preset by name: "8b", "70b", "405b", "llama3-70b", "mixtral-8x7b"."""
        key = name.lower()
        if key in _OTHER:
            shape = dict(_OTHER[key])
            if seq_len is not None:
                shape["seq_len"] = seq_len
            return cls(name=key, **shape)
        try:
            return cls.llama(key, seq_len=seq_len)
        except ValueError:
            known = [*_LLAMA, *(f"llama3-{k}" for k in _LLAMA), *_OTHER]
            raise ValueError(f"unknown model {name!r}; known: {', '.join(known)}") from None


def _near_divisor(n: int, k: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: abs(d - k))


_LLAMA = {
    "8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, seq_len=8192),
    "70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256, seq_len=8192),
    "405b": dict(layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248, vocab=128256, seq_len=8192),
}

_OTHER = {
    # Mixtral 8x7B (Jiang et al. 2024): 46.7B total, 12.9B active.
    "mixtral-8x7b": dict(
        layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000, seq_len=4096, experts=8, top_k=2
    ),
}
