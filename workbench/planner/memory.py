"""Memory per rank: model states (parameters, gradients, optimizer) and activations.

Model states (Rajbhandari et al. 2020, "ZeRO", section 3.1): mixed-precision Adam keeps
a 16-bit copy of the parameters (2 bytes), 16-bit gradients (2) and K = 12 bytes of
optimizer state (fp32 master weights, momentum, variance), 16 bytes per parameter.
Pure fp32 training keeps 4 + 4 + 8. ZeRO-1 shards the optimizer states over the
data-parallel group, ZeRO-2 also the gradients, ZeRO-3 also the parameters (FSDP is
ZeRO-3). fp8 training keeps the same states as bf16 (Transformer Engine and torchao
keep bf16 weights, fp32 master weights and Adam moments; only matmul inputs are cast),
plus, with Transformer Engine, the fp8 copy of each layer weight and of its transpose
(cached across micro-batches for the backward on Hopper): +2 bytes per local layer
matmul parameter. Under ZeRO-3 the weights are gathered per layer (torchao's fp8
all-gather) and the copies are transient, so nothing is added.

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", sections 4.1-4.3), bytes per transformer layer for sequence s,
micro-batch b, hidden h, heads a, tensor-parallel t, with 16-bit activations:

    no parallelism            s*b*h * (34 + 5*a*s/h)
    TP, no sequence parallel  s*b*h * (10 + 24/t + 5*a*s/(h*t))
    TP + sequence parallel    s*b*h/t * (34 + 5*a*s/h)
    selective recompute       drops the 5*a*s/h attention-score term
    full recompute            2*s*b*h (only each layer's input; /t with SP)

The 5*a*s/h term is the s x s attention-score matrix (softmax output 2as^2b, dropout
mask as^2b, dropout output 2as^2b). Fused attention kernels (FlashAttention, PyTorch
SDPA's flash / memory-efficient / cuDNN backends) never store it: they keep the output
and a per-row log-sum-exp and recompute the scores in the backward. So
`attention="flash"` drops the term (the same bytes as selective recompute, whose
recompute the kernel already does) and `attention="eager"` keeps it. At s = 8192,
a = 128, h = 16384 the term is 320 against 34.

fp8 (Transformer Engine): the inputs saved for the backward of the four linear layers
(QKV 2sbh, attention projection 2sbh, MLP up 2sbh, MLP down 8sbh = 14sbh of the 34)
are kept in fp8, one byte instead of two: 34 -> 27.

The formula is for the paper's GPT (MHA, 4h GELU MLP, dropout); for Llama-style models
(SwiGLU, no dropout) it is high by a few percent: a Llama 3 405B layer under flash
stores about 31.75 sbh (norm inputs 4, QKV and MLP inputs 4, Q 2, K/V 4*kv/a, output 2,
gate/up 4*ffn/h, down input 2*ffn/h) against 34. Context
parallelism (HF Ultra-Scale Playbook) shards s: linear terms use s/cp, the score term
5*a*(s/cp)*s.

Pipeline in-flight micro-batches follow the real layer assignment (pipeline.py). The
last stage also holds fp32 logits for the loss, 4*s*b*vocab/t bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from .hardware import GB, Hardware
from .layout import PlanLayout
from .model_spec import ModelSpec
from .pipeline import in_flight_layers, rank_layers

__all__ = [
    "STATE_BYTES",
    "MemoryBreakdown",
    "activation_bytes_per_layer",
    "fmt_bytes",
    "fp8_weight_bytes",
    "in_flight_layers",
    "logits_bytes",
    "memory_per_rank",
    "model_state_bytes",
    "params_on_stage",
    "state_bytes_per_param",
    "total_model_state_bytes",
]

FP8_SAVED_LINEAR_INPUTS = 14  # of the 34 s*b*h: kept in fp8 (1 byte) instead of 16-bit
FP8_WEIGHT_COPY_BYTES = 2  # fp8 weight + its transpose, per layer matmul parameter

# bytes per parameter: (parameters, gradients, optimizer states) -- ZeRO paper 3.1
STATE_BYTES = {
    "bf16": (2, 2, 12),
    "fp16": (2, 2, 12),
    "fp8": (2, 2, 12),
    "fp32": (4, 4, 8),
}


def state_bytes_per_param(precision: str) -> int:
    """16 for mixed-precision Adam (2+2+12) and for fp32 (4+4+8)."""
    return sum(STATE_BYTES[precision])


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes on the most loaded rank (the pipeline stage with the largest total)."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    stage: int
    cpu_offload: float = 0.0
    fp8_weights: float = 0.0

    @property
    def model_states(self) -> float:
        return self.parameters + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.model_states + self.activations + self.logits + self.fp8_weights

    def parts(self) -> dict[str, float]:
        out = {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "logits": self.logits,
        }
        if self.fp8_weights:
            out["fp8 weights"] = self.fp8_weights
        return out

    def fits(self, hardware: Hardware, usable_fraction: float = 0.9) -> bool:
        """True if the total fits in `usable_fraction` of device memory.

        The 10% kept back stands for the CUDA context, communication buffers and
        allocator fragmentation, which no formula here counts.
        """
        return self.total <= hardware.memory_bytes * usable_fraction

    def headroom(self, hardware: Hardware, usable_fraction: float = 0.9) -> float:
        return hardware.memory_bytes * usable_fraction - self.total


# ------------------------------------------------------------------- activations
def activation_bytes_per_layer(model: ModelSpec, layout: PlanLayout) -> float:
    """Korthikanti et al. 2022 eqs. (2)-(6) for one layer and one micro-batch.

    The score term 5*a*s^2*b/t is kept only for `attention="eager"` without selective
    recompute; fp8 keeps the linear layers' saved inputs in one byte (34 -> 27).
    """
    s = model.seq_len
    s_local = s / layout.cp
    b = layout.micro_batch_size
    h = model.hidden
    a = model.heads
    t = layout.tp
    sp = layout.seq_parallel and t > 1
    scale = 2.0 if layout.precision == "fp32" else 1.0  # formula assumes 16-bit tensors
    if layout.recompute == "full":
        return scale * 2 * s_local * b * h / (t if sp else 1)
    linear = s_local * b * h * (34 / t if sp else 10 + 24 / t)
    if layout.precision == "fp8":
        linear *= (34 - FP8_SAVED_LINEAR_INPUTS / 2) / 34
    if layout.recompute == "selective" or layout.attention == "flash":
        return scale * linear
    scores = 5 * a * s_local * s * b / t
    return scale * (linear + scores)


def logits_bytes(model: ModelSpec, layout: PlanLayout) -> float:
    """fp32 logits for the cross-entropy on the last stage (vocab-parallel over tp)."""
    return 4 * (model.seq_len / layout.cp) * layout.micro_batch_size * model.vocab / layout.tp


# ------------------------------------------------------------------ model states
def params_on_stage(model: ModelSpec, layout: PlanLayout, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters held by one rank of `stage` before ZeRO sharding.

    Attention and MLP weights split over tp, experts over ep; norms and the router are
    small and counted unsplit. The input embedding lives on the first stage and the
    output head on the last (a tied embedding is held by both when pp > 1, as in
    Megatron-LM). Embeddings are vocab-parallel over tp.
    """
    count = model.params()
    layers = rank_layers(model, layout)[stage]
    t = layout.tp
    attention = model.attention_params_per_layer() / t
    small = 2 * model.hidden + (model.hidden * model.experts if model.is_moe else 0)
    expert = count.expert_per_layer / t / layout.ep
    matrix = model.vocab * model.hidden / t
    embed = 0.0
    if layout.pp == 1:
        embed = count.embedding / t + model.hidden
    elif stage == 0:
        embed = matrix
    elif stage == layout.pp - 1:
        embed = matrix + model.hidden
    return layers * (attention + small) + embed, layers * expert


def model_state_bytes(model: ModelSpec, layout: PlanLayout, stage: int) -> tuple[float, float, float, float]:
    """(parameters, gradients, optimizer, offloaded) bytes for one rank of `stage`."""
    dense, expert = params_on_stage(model, layout, stage)
    p_bytes, g_bytes, o_bytes = STATE_BYTES[layout.precision]
    shard = layout.shard_degree
    # experts are already split ep ways; ZeRO shards them over what remains of the group
    expert_shard = max(1, shard // gcd(shard, layout.ep))
    z = layout.zero_stage

    def sharded(per_param: float, from_stage: int) -> float:
        if z >= from_stage:
            return per_param * (dense / shard + expert / expert_shard)
        return per_param * (dense + expert)

    params = sharded(p_bytes, 3)
    grads = sharded(g_bytes, 2)
    optim = sharded(o_bytes, 1)
    offloaded = 0.0
    if layout.optimizer_offload:  # ZeRO-Offload (Ren et al. 2021): states live in CPU RAM
        offloaded, optim = optim, 0.0
    return params, grads, optim, offloaded


def fp8_weight_bytes(model: ModelSpec, layout: PlanLayout, stage: int) -> float:
    """Transformer Engine's cached fp8 weight copies (weight and transpose) on `stage`."""
    if layout.precision != "fp8" or layout.zero_stage == 3:
        return 0.0
    matmul = (
        model.attention_params_per_layer() / layout.tp
        + model.mlp_params_per_expert() * model.experts / layout.tp / layout.ep
    )
    return FP8_WEIGHT_COPY_BYTES * matmul * rank_layers(model, layout)[stage]


def memory_per_rank(model: ModelSpec, layout: PlanLayout) -> MemoryBreakdown:
    """Memory of the most loaded rank, every pipeline stage compared."""
    layout.validate_for(model)
    per_layer = activation_bytes_per_layer(model, layout)
    best: MemoryBreakdown | None = None
    for stage in range(layout.pp):
        params, grads, optim, offloaded = model_state_bytes(model, layout, stage)
        acts = per_layer * in_flight_layers(model, layout, stage)
        logits = logits_bytes(model, layout) if stage == layout.pp - 1 else 0.0
        candidate = MemoryBreakdown(
            params, grads, optim, acts, logits, stage, offloaded, fp8_weight_bytes(model, layout, stage)
        )
        if best is None or candidate.total > best.total:
            best = candidate
    assert best is not None
    return best


def total_model_state_bytes(model: ModelSpec, precision: str = "bf16") -> float:
    """Unsharded model states of the whole model (16 bytes/param for Adam)."""
    return model.params().total * state_bytes_per_param(precision)


def fmt_bytes(n: float) -> str:
    """Human-readable decimal size (GB = 1e9, as memory is sold)."""
    for unit, size in (("TB", 1e12), ("GB", GB), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
