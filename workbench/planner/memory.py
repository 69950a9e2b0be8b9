"""Memory per rank: model states (parameters, gradients, optimizer) and activations.

Model states follow ZeRO (Rajbhandari et al. 2020, section 3.1: 16 bytes a parameter under
mixed-precision Adam, sharded by stage); activations are counted tensor by tensor from the
model's shape (Korthikanti et al. 2022, sections 4.1-4.3: :func:`saved_tensors`), or from what
transformers' modules keep, which dry runs of the workbench's layouts measured. Every term and
its source is in docs/planner.md and docs/dry-run.md."""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from .hardware import GB, Hardware
from .layout import PlanLayout
from .model_spec import ModelSpec
from .pipeline import in_flight_layers, rank_layers

__all__ = [
    "MASTER_STATE_BYTES",
    "STATE_BYTES",
    "MemoryBreakdown",
    "SavedTensor",
    "activation_bytes_per_layer",
    "fmt_bytes",
    "fp8_weight_bytes",
    "in_flight_layers",
    "logits_bytes",
    "memory_per_rank",
    "model_state_bytes",
    "param_terms_on_stage",
    "params_on_stage",
    "pipeline_fsdp_bytes",
    "saved_sbh",
    "saved_tensors",
    "score_sbh",
    "state_bytes",
    "state_bytes_per_param",
    "total_model_state_bytes",
]

FP8_WEIGHT_COPY_BYTES = 2  # fp8 weight + its transpose, per layer matmul parameter

# bytes per parameter: (parameters, gradients, optimizer states) -- ZeRO paper 3.1
STATE_BYTES = {
    "bf16": (2, 2, 12),
    "fp16": (2, 2, 12),
    "fp8": (2, 2, 12),
    "fp32": (4, 4, 8),
}


# fp32 parameters (the master copy) and gradients, Adam's two moments: PlanLayout.master_params
MASTER_STATE_BYTES = (4, 4, 8)


def state_bytes_per_param(precision: str) -> int:
    """16 for mixed-precision Adam (2+2+12) and for fp32 (4+4+8)."""
    return sum(STATE_BYTES[precision])


def state_bytes(layout: PlanLayout) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer) bytes per parameter of ``layout``."""
    return MASTER_STATE_BYTES if layout.master_params else STATE_BYTES[layout.precision]


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
    pipeline_fsdp: float = 0.0  # gathered parameters and unsharded gradients kept across micro-batches

    @property
    def model_states(self) -> float:
        return self.parameters + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.model_states + self.activations + self.logits + self.fp8_weights + self.pipeline_fsdp

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
        if self.pipeline_fsdp:
            out["gathered across micro-batches"] = self.pipeline_fsdp
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
@dataclass(frozen=True)
class SavedTensor:
    """One tensor a layer keeps for its backward: `sbh` bytes per s*b*h (16-bit).

    `split`: divided over tensor-parallel ranks even without sequence parallelism;
    `matmul_input`: saved as the input of a linear layer (kept in fp8 under fp8).
    """

    name: str
    sbh: float
    split: bool
    matmul_input: bool = False
    fp32: bool = False  # kept in fp32 whatever the compute precision (sbh counts its 4 bytes)


def _transformers_saved(model: ModelSpec, ffn: float) -> list[SavedTensor]:
    """Hugging Face's eager Llama layer in 16-bit (see the module doc)."""
    return [
        SavedTensor("norm inputs in fp32", 8, False, fp32=True),
        SavedTensor("norm outputs", 4, False),
        SavedTensor("attention input", 2, False, True),
        SavedTensor("Q", 2, True),
        SavedTensor("K, V", 4 * model.kv_heads / model.heads, True),
        SavedTensor("softmax log-sum-exp", 4 * model.heads / model.hidden, True, fp32=True),
        SavedTensor("attention output", 2, True, True),
        SavedTensor("MLP input", 2, False, True),
        SavedTensor("gate, up", 4 * ffn, True),
        SavedTensor("SiLU output", 2 * ffn, True),
        SavedTensor("down input", 2 * ffn, True, True),
    ]


def saved_tensors(model: ModelSpec) -> tuple[SavedTensor, ...]:
    """What one transformer layer of `model` stores for its backward, scores excluded."""
    ffn = model.ffn / model.hidden * model.top_k
    if model.implementation == "transformers" and model.gated_mlp:
        return tuple(_transformers_saved(model, ffn))
    out = [
        SavedTensor("norm inputs", 4, False),
        SavedTensor("attention input", 2, False, True),
        SavedTensor("Q", 2, True),
        SavedTensor("K, V", 4 * model.kv_heads / model.heads, True),
        SavedTensor("attention output", 2, True, True),
        SavedTensor("MLP input", 2, False, True),
    ]
    if model.gated_mlp:
        out += [SavedTensor("gate, up", 4 * ffn, True), SavedTensor("down input", 2 * ffn, True, True)]
    else:
        out += [SavedTensor("fc1 output", 2 * ffn, True), SavedTensor("activation output", 2 * ffn, True, True)]
    if model.dropout:
        out.append(SavedTensor("dropout masks", 2, False))
    return tuple(out)


def saved_sbh(model: ModelSpec) -> float:
    """Bytes per s*b*h per layer without scores: 34 for Korthikanti's GPT, 31.75 for Llama 3 405B."""
    return sum(t.sbh for t in saved_tensors(model))


def score_sbh(model: ModelSpec) -> float:
    """Bytes per a*s^2*b of an eager attention: softmax output 2 (+ dropout mask 1 and output 2)."""
    return 5 if model.dropout else 2


def activation_bytes_per_layer(model: ModelSpec, layout: PlanLayout) -> float:
    """Bytes one layer keeps for one micro-batch (Korthikanti et al. 2022 eqs. (2)-(6)).

    The terms of `saved_tensors` (all /t with sequence parallelism); the score term
    `score_sbh * a * s^2 * b / t` only for `attention="eager"` without selective
    recompute; fp8 keeps the saved linear inputs in one byte.
    """
    s = model.seq_len
    s_local = s / layout.cp
    b = layout.micro_batch_size
    h = model.hidden
    t = layout.tp
    sp = layout.seq_parallel and t > 1
    scale = 2.0 if layout.precision == "fp32" else 1.0  # the counts assume 16-bit tensors
    if layout.recompute == "full":
        return scale * 2 * s_local * b * h / (t if sp else 1)
    linear = 0.0
    for tensor in saved_tensors(model):
        size = tensor.sbh / 2 if layout.precision == "fp8" and tensor.matmul_input else tensor.sbh
        size *= 1.0 if tensor.fp32 else scale
        linear += size / t if sp or tensor.split else size
    linear *= s_local * b * h
    if layout.recompute == "selective" or layout.attention == "flash":
        return linear
    scores = score_sbh(model) * model.heads * s_local * s * b / t
    return linear + scale * scores


def logits_bytes(model: ModelSpec, layout: PlanLayout) -> float:
    """The loss's logits on the last stage: fp32 for the cross-entropy (Megatron-LM), or
    transformers' 14 B a logit (see the module doc); split over tp where ``logits_tp``."""
    per_logit = 4.0
    if model.implementation == "transformers":
        per_logit = (4 if layout.precision == "fp32" else 2) + 4 + 4 + 4
    t = layout.tp if layout.logits_tp else 1
    return per_logit * (model.seq_len / layout.cp) * layout.micro_batch_size * model.vocab / t


# ------------------------------------------------------------------ model states
def param_terms_on_stage(model: ModelSpec, layout: PlanLayout, stage: int) -> dict[str, float]:
    """Parameters one rank of `stage` holds before ZeRO sharding, by module: embedding,
    attention, mlp (the experts for MoE: split over tp and ep), norms (with an MoE
    router), head.

    Attention and MLP weights split over tp; norms and the router are small and unsplit. The
    input embedding lives on the first stage (vocab-parallel over tp unless
    ``layout.embedding_tp`` is False) and the output head, vocab-parallel, on the last; a
    tied embedding is one matrix without pipeline stages and held by both ends with them,
    as in Megatron-LM.
    """
    count = model.params()
    layers = rank_layers(model, layout)[stage]
    t = layout.tp
    first, last = stage == 0, stage == layout.pp - 1
    matrix = model.vocab * model.hidden
    embedding = matrix / (t if layout.embedding_tp else 1) if first else 0.0
    head = matrix / t if last and (layout.pp > 1 or not model.tied_embeddings) else 0.0
    router = model.hidden * model.experts if model.is_moe else 0
    return {
        "embedding": embedding,
        "attention": layers * model.attention_params_per_layer() / t,
        "mlp": layers * count.expert_per_layer / t / layout.ep,
        "norms": layers * (2 * model.hidden + router) + (model.hidden if last else 0),
        "head": head,
    }


def params_on_stage(model: ModelSpec, layout: PlanLayout, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters held by one rank of `stage` before ZeRO sharding
    (:func:`param_terms_on_stage`; the MLP is the "expert" part, sharded over what ep leaves)."""
    terms = param_terms_on_stage(model, layout, stage)
    return sum(v for k, v in terms.items() if k != "mlp"), terms["mlp"]


def pipeline_fsdp_bytes(model: ModelSpec, layout: PlanLayout, stage: int) -> float:
    """FSDP under a pipeline schedule: the stage's gathered 16-bit parameters and unsharded
    fp32 gradients, kept from its first backward to the last micro-batch's (6 B per
    parameter of the stage), where that is part of its peak (see the module doc); else 0."""
    if layout.pp == 1 or layout.zero_stage < 3 or layout.shard_degree == 1 or layout.schedule == "gpipe":
        return 0.0
    if layout.microbatches * layout.virtual_stages <= layout.pp - stage:
        return 0.0  # every forward runs before the first backward: no steady phase
    gathered = 4 if layout.precision == "fp32" else 2
    return (gathered + 4) * sum(params_on_stage(model, layout, stage))


def lora_on_stage(model: ModelSpec, layout: PlanLayout, stage: int) -> tuple[float, float]:
    """(dense, expert) LoRA adapter parameters held by one rank of ``stage`` before ZeRO sharding
    (split over tp like the matrices they adapt; experts' over ep)."""
    attention, mlp = model.lora_params_per_layer(layout.lora_rank)
    layers = rank_layers(model, layout)[stage]
    t = layout.tp
    if model.is_moe:
        return layers * attention / t, layers * model.experts * mlp / t / layout.ep
    return layers * (attention + mlp) / t, 0.0


def model_state_bytes(model: ModelSpec, layout: PlanLayout, stage: int) -> tuple[float, float, float, float]:
    """(parameters, gradients, optimizer, offloaded) bytes for one rank of `stage`."""
    dense, expert = params_on_stage(model, layout, stage)
    p_bytes, g_bytes, o_bytes = state_bytes(layout)
    shard = layout.shard_degree
    # experts are already split ep ways; ZeRO shards them over what remains of the group
    expert_shard = max(1, shard // gcd(shard, layout.ep))
    z = layout.zero_stage

    def sharded(per_param: float, from_stage: int, counts: tuple[float, float]) -> float:
        d, e = counts
        if z >= from_stage:
            return per_param * (d / shard + e / expert_shard)
        return per_param * (d + e)

    base = (dense, expert)
    # LoRA: the base is frozen, so only the adapters (held beside it) carry gradients and optimizer state
    trained = lora_on_stage(model, layout, stage) if layout.lora_rank else base
    params = sharded(p_bytes, 3, base) + (sharded(p_bytes, 3, trained) if layout.lora_rank else 0.0)
    grads = sharded(g_bytes, 2, trained)
    optim = sharded(o_bytes, 1, trained)
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
            params,
            grads,
            optim,
            acts,
            logits,
            stage,
            offloaded,
            fp8_weight_bytes(model, layout, stage),
            pipeline_fsdp_bytes(model, layout, stage),
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
