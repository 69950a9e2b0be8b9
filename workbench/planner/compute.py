"""Compute: step time, pipeline bubble, MFU, throughput, wall-clock and cost.

Time per token is the FLOPs of :mod:`.flops` at the matmul and attention peaks, scaled by
one achievable fraction (``kernel_efficiency``) for every part and every run; the step time
adds stage imbalance, the bubble, exposed communication and offload (docs/planner.md)."""

from __future__ import annotations

from dataclasses import dataclass

from .flops import attention_flops_per_token, flops_per_token, layer_and_head_seconds, token_flops
from .hardware import Hardware, load_hardware
from .layout import PlanLayout
from .model_spec import ModelSpec
from .pipeline import assignment_bubble, rank_layers

__all__ = [
    "DEFAULT_KERNEL_EFFICIENCY",
    "ComputeEstimate",
    "RunCost",
    "attention_flops_per_token",
    "bubble_fraction",
    "estimate_compute",
    "flops_per_token",
    "implied_mfu",
    "recompute_flops_per_token",
    "run_cost",
    "stage_imbalance",
    "training_days",
]

SECONDS_PER_DAY = 86_400
# The one achievable fraction of the dense peak for every part and every run: what
# large-message bf16 GEMMs of training shapes sustain on H100 / A100 (cuBLAS reaches
# ~0.6-0.75 of the datasheet peak; the elementwise work between them costs the rest).
DEFAULT_KERNEL_EFFICIENCY = 0.55
# ZeRO-Offload's CPU Adam: parameters updated per second for one GPU's share of the
# host cores (an assumption stated here, not a measurement of this machine).
CPU_ADAM_PARAMS_PER_SECOND = 1e9


def recompute_flops_per_token(model: ModelSpec, recompute: str) -> float:
    """Extra FLOPs per token spent re-running forward work (published convention).

    full: one more forward of everything (2 N + the forward third of the attention
    term); selective: only the attention scores (Korthikanti et al. 2022, section 5).
    """
    attention_forward = attention_flops_per_token(model) / 3
    if recompute == "full":
        return 2 * model.params().active + attention_forward
    if recompute == "selective":
        return attention_forward
    return 0.0


def bubble_fraction(pp: int, microbatches: int, schedule: str = "1f1b", virtual_stages: int = 1) -> float:
    """Pipeline idle time for even stages: (p-1)/m, or (p-1)/(m v) interleaved."""
    if pp <= 1:
        return 0.0
    v = virtual_stages if schedule == "interleaved" else 1
    return (pp - 1) / (microbatches * v)


def stage_imbalance(model: ModelSpec, layout: PlanLayout, layer_seconds: float, head_seconds: float) -> float:
    """Busiest pipeline rank's work over the mean rank's, minus one (0 when even)."""
    if layout.pp <= 1:
        return 0.0
    work = [n * layer_seconds for n in rank_layers(model, layout)]
    work[-1] += head_seconds
    return max(work) / (sum(work) / len(work)) - 1


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
    imbalance: float = 0.0
    matmul_seconds: float = 0.0
    attention_seconds: float = 0.0
    offload_seconds: float = 0.0
    published_flops_per_step: float = 0.0
    published_hardware_flops_per_step: float = 0.0
    peak_flops: float = 0.0
    devices: int = 1

    def _per_peak(self, flops: float) -> float:
        return flops / (self.step_seconds * self.devices * self.peak_flops)

    @property
    def mfu_published(self) -> float:
        """MFU in the published convention: (6N + 12 L h s) per token (PaLM appendix B)."""
        return self._per_peak(self.published_flops_per_step)

    @property
    def hfu_published(self) -> float:
        """The same with recompute counted, as Narayanan et al. 2021 report "% of peak"."""
        return self._per_peak(self.published_hardware_flops_per_step)

    @property
    def hfu(self) -> float:
        """FLOPs the kernels run (recompute included) over the peak."""
        return self._per_peak(self.hardware_flops_per_step)

    def flops_per_device_per_second(self, convention: str = "published_hardware") -> float:
        """Achieved FLOP/s per device: convention "model", "hardware", "published" or
        "published_hardware" (the last is what Narayanan et al. 2021 quote per GPU)."""
        return getattr(self, f"{convention}_flops_per_step") / self.devices / self.step_seconds


def estimate_compute(
    model: ModelSpec,
    layout: PlanLayout,
    hardware: Hardware,
    exposed_comm_seconds: float = 0.0,
    kernel_efficiency: float = DEFAULT_KERNEL_EFFICIENCY,
    offload_seconds: float = 0.0,
) -> ComputeEstimate:
    """Step time and MFU of one optimizer step of dp * m * mbs sequences."""
    tokens = layout.dp * layout.microbatches * layout.micro_batch_size * model.seq_len
    per_token = token_flops(model, layout)
    peak = hardware.peak_flops(layout.precision)
    matmul_rate = peak * kernel_efficiency
    other = "bf16" if layout.precision == "fp8" else layout.precision
    attention_rate = hardware.peak_flops(other) * kernel_efficiency
    world = layout.world_size
    matmul_s = per_token.matmul * tokens / world / matmul_rate
    attention_s = per_token.attention * tokens / world / attention_rate
    layer_s, head_s = layer_and_head_seconds(model, layout, matmul_rate, attention_rate)
    imbalance = stage_imbalance(model, layout, layer_s, head_s)
    compute = (matmul_s + attention_s) * (1 + imbalance)
    bubble = assignment_bubble(model, layout)
    step = compute * (1 + bubble) + exposed_comm_seconds + offload_seconds
    model_flops = per_token.model * tokens
    mfu = model_flops / (step * world * peak)
    return ComputeEstimate(
        tokens,
        model_flops,
        per_token.hardware * tokens,
        compute,
        bubble,
        compute * bubble,
        exposed_comm_seconds,
        step,
        mfu,
        tokens / step,
        kernel_efficiency,
        imbalance=imbalance,
        matmul_seconds=matmul_s,
        attention_seconds=attention_s,
        offload_seconds=offload_seconds,
        published_flops_per_step=per_token.published * tokens,
        published_hardware_flops_per_step=per_token.published_hardware * tokens,
        peak_flops=peak,
        devices=world,
    )


def offload_seconds(
    optimizer_params: float, host_link_bytes_per_s: float, param_bytes: int = 2, grad_bytes: int = 2
) -> float:
    """ZeRO-Offload per step: gradients down, updated parameters up over the host link,
    and the CPU Adam update of this rank's optimizer shard (Ren et al. 2021)."""
    if optimizer_params <= 0:
        return 0.0
    copies = optimizer_params * (param_bytes + grad_bytes) / host_link_bytes_per_s
    return copies + optimizer_params / CPU_ADAM_PARAMS_PER_SECOND


def nvme_seconds(optimizer_params: float, disk_bytes_per_s: float, state_bytes: int = 12) -> float:
    """ZeRO-Infinity per step (Rajbhandari et al. 2021): the optimizer shard's state (fp32
    master, Adam's m and v) read from NVMe before the CPU Adam step and written back after,
    on top of :func:`offload_seconds`; counted without overlap (an upper bound)."""
    if optimizer_params <= 0 or disk_bytes_per_s <= 0:
        return 0.0
    return 2 * optimizer_params * state_bytes / disk_bytes_per_s


# ------------------------------------------------------------------ budget and cost
def training_days(
    model: ModelSpec, tokens: float, gpus: int, hardware: Hardware | str, mfu: float, precision: str = "bf16"
) -> float:
    """Days to train on `tokens`: tokens * FLOPs/token / (gpus * peak * MFU)."""
    hw = load_hardware(hardware)
    throughput = gpus * hw.peak_flops(precision) * mfu
    return tokens * flops_per_token(model) / throughput / SECONDS_PER_DAY


def implied_mfu(
    model: ModelSpec, tokens: float, gpus: int, hardware: Hardware | str, days: float, precision: str = "bf16"
) -> float:
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
        text = (
            f"{self.gpus} GPUs x {self.days:.1f} days = {self.gpu_hours:,.0f} GPU-hours"
            f" x {self.price_per_hour:g} USD/h = {self.usd / 1e6:.3f}M USD"
        )
        if self.usd_range:
            low, high = self.usd_range
            text += f" (range {low / 1e6:.3f}-{high / 1e6:.3f}M)"
        return text


def run_cost(
    gpus: int,
    days: float | None = None,
    price: float | None = None,
    *,
    model: ModelSpec | None = None,
    tokens: float | None = None,
    hardware: Hardware | str | None = None,
    mfu: float | None = None,
    precision: str = "bf16",
) -> RunCost:
    """GPU-hours and USD of a run: gpus * days * 24 * price.

    Give `days` directly, or leave it None and give model, tokens, hardware and mfu to
    derive it with `training_days`. `price` defaults to the middle of the hardware's
    quoted range; with hardware known, the low-high range is reported too.
    """
    hw = load_hardware(hardware) if hardware is not None else None
    if days is None:
        missing = [k for k, v in dict(model=model, tokens=tokens, hardware=hw, mfu=mfu).items() if v is None]
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
