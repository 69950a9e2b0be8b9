"""Compute: FLOPs, pipeline bubble, step time, MFU, throughput, wall-clock and cost.

FLOPs per token (convention of Chowdhery et al. 2022, PaLM, appendix B, also used by
the HF Ultra-Scale Playbook and Megatron's MFU): 6 N for the matmuls with the
parameters (2 forward + 4 backward per parameter; N = active parameters, embeddings
included) plus 12 * layers * hidden * seq_len for the attention scores (QK^T and AV,
forward and backward, causal mask NOT halved). MFU counts these model FLOPs only; the
extra forward of activation recomputation is hardware work, not model work.

Pipeline bubble (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", section 2.2): with p stages and m micro-batches the
idle time is (p-1)/m of the ideal compute time for GPipe and 1F1B, and (p-1)/(m*v) with
v interleaved model chunks per rank.

Step time = compute / (peak * kernel_efficiency) * (1 + bubble) + exposed
communication. kernel_efficiency is the fraction of peak the matmul-heavy kernels
reach (0.55 is typical of well-tuned bf16 training on H100-class parts).
"""

from __future__ import annotations

from dataclasses import dataclass

from .hardware import Hardware, load_hardware
from .layout import PlanLayout
from .model_spec import ModelSpec

SECONDS_PER_DAY = 86_400
DEFAULT_KERNEL_EFFICIENCY = 0.55


def attention_flops_per_token(model: ModelSpec) -> float:
    """12 * layers * hidden * seq_len (PaLM appendix B), forward + backward."""
    return 12 * model.layers * model.hidden * model.seq_len


def flops_per_token(model: ModelSpec, include_attention: bool = True) -> float:
    """Model FLOPs per trained token: 6 N_active (+ the attention term)."""
    n = model.params().active
    return 6 * n + (attention_flops_per_token(model) if include_attention else 0)


def recompute_flops_per_token(model: ModelSpec, recompute: str) -> float:
    """Extra hardware FLOPs per token spent re-running forward work.

    full: one more forward of everything (2 N + the forward third of the attention
    term); selective: only the attention scores (Korthikanti et al. 2022, section 5).
    """
    attention_forward = attention_flops_per_token(model) / 3
    if recompute == "full":
        return 2 * model.params().active + attention_forward
    if recompute == "selective":
        return attention_forward
    return 0.0


def bubble_fraction(pp: int, microbatches: int, schedule: str = "1f1b",
                    virtual_stages: int = 1) -> float:
    """Pipeline idle time as a fraction of ideal compute: (p-1)/m, or /v interleaved."""
    if pp <= 1:
        return 0.0
    v = virtual_stages if schedule == "interleaved" else 1
    return (pp - 1) / (microbatches * v)


@dataclass(frozen=True)
class ComputeEstimate:
    tokens_per_step: int
    model_flops_per_step: float
    hardware_flops_per_step: float
    compute_seconds: float
    bubble: float
    bubble_seconds: float
    exposed_comm_seconds: float
    step_seconds: float
    mfu: float
    tokens_per_second: float
    kernel_efficiency: float


def estimate_compute(model: ModelSpec, layout: PlanLayout, hardware: Hardware,
                     exposed_comm_seconds: float = 0.0,
                     kernel_efficiency: float = DEFAULT_KERNEL_EFFICIENCY) -> ComputeEstimate:
    """Step time and MFU of one optimizer step of dp * m * mbs sequences."""
    tokens = layout.dp * layout.microbatches * layout.micro_batch_size * model.seq_len
    model_flops = flops_per_token(model) * tokens
    hw_flops = model_flops + recompute_flops_per_token(model, layout.recompute) * tokens
    peak = hardware.peak_flops(layout.precision)
    compute = hw_flops / layout.world_size / (peak * kernel_efficiency)
    bubble = bubble_fraction(layout.pp, layout.microbatches, layout.schedule,
                             layout.virtual_stages)
    step = compute * (1 + bubble) + exposed_comm_seconds
    mfu = model_flops / (step * layout.world_size * peak)
    return ComputeEstimate(tokens, model_flops, hw_flops, compute, bubble, compute * bubble,
                           exposed_comm_seconds, step, mfu, tokens / step, kernel_efficiency)


# ------------------------------------------------------------------ budget and cost
def training_days(model: ModelSpec, tokens: float, gpus: int, hardware: "Hardware | str",
                  mfu: float, precision: str = "bf16") -> float:
    """Days to train on `tokens`: tokens * FLOPs/token / (gpus * peak * MFU)."""
    hw = load_hardware(hardware)
    throughput = gpus * hw.peak_flops(precision) * mfu
    return tokens * flops_per_token(model) / throughput / SECONDS_PER_DAY


def implied_mfu(model: ModelSpec, tokens: float, gpus: int, hardware: "Hardware | str",
                days: float, precision: str = "bf16") -> float:
    """The MFU a quoted (gpus, days) for a token budget assumes (inverse of the above)."""
    hw = load_hardware(hardware)
    available = gpus * hw.peak_flops(precision) * days * SECONDS_PER_DAY
    return tokens * flops_per_token(model) / available


@dataclass(frozen=True)
class RunCost:
    gpus: int
    days: float
    gpu_hours: float
    price_per_hour: float
    usd: float
    usd_range: tuple[float, float] | None = None

    def __str__(self) -> str:
        text = (f"{self.gpus} GPUs x {self.days:.1f} days = {self.gpu_hours:,.0f} GPU-hours"
                f" x {self.price_per_hour:g} USD/h = {self.usd / 1e6:.3f}M USD")
        if self.usd_range:
            low, high = self.usd_range
            text += f" (range {low / 1e6:.3f}-{high / 1e6:.3f}M)"
        return text


def run_cost(gpus: int, days: float | None = None, price: float | None = None, *,
             model: ModelSpec | None = None, tokens: float | None = None,
             hardware: "Hardware | str | None" = None, mfu: float | None = None,
             precision: str = "bf16") -> RunCost:
    """GPU-hours and USD of a run: gpus * days * 24 * price.

    Give `days` directly, or leave it None and give model, tokens, hardware and mfu to
    derive it with `training_days`. `price` defaults to the middle of the hardware's
    quoted range; with hardware known, the low-high range is reported too.
    """
    hw = load_hardware(hardware) if hardware is not None else None
    if days is None:
        missing = [k for k, v in dict(model=model, tokens=tokens, hardware=hw, mfu=mfu).items()
                   if v is None]
        if missing:
            raise ValueError(f"run_cost: give days, or derive them with {', '.join(missing)}")
        days = training_days(model, tokens, gpus, hw, mfu, precision)
    if price is None:
        if hw is None:
            raise ValueError("run_cost: give price (USD per GPU-hour) or hardware")
        price = hw.price_mid
    hours = gpus * days * 24
    rng = None
    if hw is not None:
        low, high = hw.price_usd_per_hour
        rng = (hours * low, hours * high)
    return RunCost(gpus, days, hours, price, hours * price, rng)
