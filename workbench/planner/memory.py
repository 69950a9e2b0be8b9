"""Memory per rank: model states (parameters, gradients, optimizer) and activations.

Model states (Rajbhandari et al. 2020, "ZeRO", section 3.1): mixed-precision Adam keeps
a 16-bit copy of the parameters (2 bytes), 16-bit gradients (2) and K = 12 bytes of
optimizer state (fp32 master weights, momentum, variance), 16 bytes per parameter.
Pure fp32 training keeps 4 + 4 + 8. ZeRO-1 shards the optimizer states over the
data-parallel group, ZeRO-2 also the gradients, ZeRO-3 also the parameters (FSDP is
ZeRO-3). fp8 training (Transformer Engine) keeps bf16 master copies, so it is counted
as bf16 here: the fp8 casts are transient.

Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", sections 4.1-4.3), bytes per transformer layer for sequence s,
micro-batch b, hidden h, heads a, tensor-parallel t, with 16-bit activations:

    no parallelism            s*b*h * (34 + 5*a*s/h)
    TP, no sequence parallel  s*b*h * (10 + 24/t + 5*a*s/(h*t))
    TP + sequence parallel    s*b*h/t * (34 + 5*a*s/h)
    selective recompute       drops the 5*a*s/h attention-score term
    full recompute            2*s*b*h (only each layer's input; /t with SP)

The formula is for the paper's GPT (MHA, 4h GELU MLP, dropout); for Llama-style models
it is a documented, slightly conservative estimate. Context parallelism (HF
Ultra-Scale Playbook) shards s: linear terms use s/cp, the score term 5*a*(s/cp)*s.

Pipeline in-flight microbatches on the first stage: GPipe keeps all m; 1F1B keeps
min(p, m), i.e. the whole model's layers worth (Narayanan et al. 2021); the interleaved
schedule multiplies that by (1 + (p-1)/(p*v)) (Korthikanti et al. 2022, section 4.2.3).
The last stage also holds fp32 logits for the loss, 4*s*b*vocab/t bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from .hardware import GB, Hardware
from .layout import PlanLayout
from .model_spec import ModelSpec

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

    @property
    def model_states(self) -> float:
        return self.parameters + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.model_states + self.activations + self.logits

    def parts(self) -> dict[str, float]:
        return {"parameters": self.parameters, "gradients": self.gradients,
                "optimizer": self.optimizer, "activations": self.activations,
                "logits": self.logits}

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
    """Korthikanti et al. 2022 eqs. (2)-(6) for one layer and one micro-batch."""
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
    if layout.recompute == "selective":
        return scale * linear
    scores = 5 * a * s_local * s * b / t
    return scale * (linear + scores)


def in_flight_layers(model: ModelSpec, layout: PlanLayout, stage: int = 0) -> float:
    """Layers' worth of activations held at once by pipeline `stage`.

    GPipe: m micro-batches x L/p layers. 1F1B: min(p - stage, m) x L/p. Interleaved:
    the 1F1B amount times (1 + (p-1)/(p*v)) on the first stage.
    """
    per_stage = layout.layers_per_stage(model)
    p, m = layout.pp, layout.microbatches
    if p == 1:
        return per_stage
    if layout.schedule == "gpipe":
        return m * per_stage
    held = min(p - stage, m) * per_stage
    if layout.schedule == "interleaved":
        held *= 1 + (p - 1 - stage) / (p * layout.virtual_stages)
    return held


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
    layers = layout.layers_per_stage(model)
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


def model_state_bytes(model: ModelSpec, layout: PlanLayout, stage: int
                      ) -> tuple[float, float, float, float]:
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


def memory_per_rank(model: ModelSpec, layout: PlanLayout) -> MemoryBreakdown:
    """Memory of the most loaded rank: first and last pipeline stages are compared."""
    layout.validate_for(model)
    per_layer = activation_bytes_per_layer(model, layout)
    stages = {0, layout.pp - 1}
    best: MemoryBreakdown | None = None
    for stage in sorted(stages):
        params, grads, optim, offloaded = model_state_bytes(model, layout, stage)
        acts = per_layer * in_flight_layers(model, layout, stage)
        logits = logits_bytes(model, layout) if stage == layout.pp - 1 else 0.0
        candidate = MemoryBreakdown(params, grads, optim, acts, logits, stage, offloaded)
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
