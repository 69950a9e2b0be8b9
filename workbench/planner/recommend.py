"""Search layouts for a model on N devices: keep those that fit, rank by step time.

The search follows the HF Ultra-Scale Playbook ("first fit a replica in memory, then scale
the batch with DP"): TP inside a node, PP across nodes, ZeRO and recompute as memory savers,
CP for long sequences, EP for experts, offload where nothing else fits (docs/planner.md). The
global batch is held fixed, so step times of different layouts compare like for like."""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

from .compute import DEFAULT_KERNEL_EFFICIENCY
from .hardware import Hardware, load_hardware
from .layout import RECOMPUTE, PlanLayout
from .memory import fmt_bytes, memory_per_rank, total_model_state_bytes
from .model_spec import ModelSpec
from .report import Plan, plan

LONG_CONTEXT = 32_768  # sequence length from which context parallelism is searched
MIN_CP_CHUNK = 4_096  # tokens per CP rank below which the ring is not worth its hops


@dataclass(frozen=True)
class Recommendation:
    layout: PlanLayout
    plan: Plan
    reason: str

    def __str__(self) -> str:
        c = self.plan.compute
        return (
            f"{self.layout.describe():<48} step {c.step_seconds:6.2f} s  "
            f"MFU {c.mfu:5.1%}  mem {fmt_bytes(self.plan.memory.total):>9}  "
            f"| {self.reason}"
        )


def default_global_batch(model: ModelSpec, gpus: int, target_tokens: float = 4 * 2**20) -> int:
    """Sequences per step: ~4M tokens (Llama 3 pre-training), a multiple of `gpus`."""
    sequences = max(1, round(target_tokens / model.seq_len))
    return -(-sequences // gpus) * gpus


def context_parallel_degrees(model: ModelSpec, gpus: int) -> list[int]:
    """CP degrees searched by default: 1, and from LONG_CONTEXT tokens up every degree
    that leaves chunks of at least MIN_CP_CHUNK tokens."""
    if model.seq_len < LONG_CONTEXT:
        return [1]
    return [
        c for c in range(1, gpus + 1) if gpus % c == 0 and model.seq_len % c == 0 and model.seq_len // c >= MIN_CP_CHUNK
    ]


def candidate_layouts(
    model: ModelSpec,
    gpus: int,
    hardware: Hardware,
    *,
    global_batch: int,
    precision: str = "bf16",
    micro_batch_size: int = 1,
    attention: str = "flash",
    cps: list[int] | None = None,
) -> list[PlanLayout]:
    """Every (tp, cp, pp, dp, ep, zero, recompute, schedule) the model and batch allow."""
    out = []
    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    tps = [
        t
        for t in divisors
        if t <= hardware.devices_per_node
        and t <= model.heads
        and model.heads % t == 0
        and model.ffn % t == 0
        and (model.kv_heads % t == 0 or t % model.kv_heads == 0)
    ]
    cps = context_parallel_degrees(model, gpus) if cps is None else cps
    recomputes = [r for r in RECOMPUTE if not (attention == "flash" and r == "selective")]
    for tp, cp, pp in product(tps, cps, divisors):
        if (gpus // (tp * cp)) % pp or pp > model.layers or gpus % (tp * cp):
            continue
        dp = gpus // (tp * cp * pp)
        if global_batch % (dp * micro_batch_size):
            continue
        m = global_batch // (dp * micro_batch_size)
        schedules = [("1f1b", 1)]
        if pp > 1 and m % pp == 0 and model.layers >= 2 * pp:
            schedules.append(("interleaved", 2))
        eps = [e for e in divisors if model.is_moe and model.experts % e == 0 and dp % e == 0]
        for zero, recompute, (schedule, v), ep in product(range(4), recomputes, schedules, eps or [1]):
            if zero and dp * cp == 1:
                continue
            if zero == 0 and cp > 1:
                continue  # cp ranks hold the same parameters: shard them (torchtitan dp_shard_cp)
            shard = dict(dp_shard=dp) if zero else dict(dp_replicate=dp)
            out.append(
                PlanLayout(
                    tp=tp,
                    cp=cp,
                    pp=pp,
                    ep=ep,
                    zero_stage=zero,
                    microbatches=m,
                    schedule=schedule,
                    virtual_stages=v,
                    recompute=recompute,
                    precision=precision,
                    micro_batch_size=micro_batch_size,
                    attention=attention,
                    **shard,
                )
            )
    return out


def recommend(
    model: ModelSpec,
    gpus: int,
    hardware: Hardware | str,
    *,
    top: int = 5,
    global_batch: int | None = None,
    precision: str = "bf16",
    micro_batch_size: int = 1,
    attention: str = "flash",
    cps: list[int] | None = None,
    offload: bool = False,
    kernel_efficiency: float = DEFAULT_KERNEL_EFFICIENCY,
) -> list[Recommendation]:
    """Layouts of `gpus` devices that fit in memory, fastest estimated step first.

    `precision="fp8"` plans fp8 matmuls (and fp8 memory); `attention` is the kernel the
    run will use; `cps` the context-parallel degrees to search (default: see
    `context_parallel_degrees`); `offload=True` also tries optimizer offload where a
    layout does not fit without it. Ties (e.g. ZeRO-1 and ZeRO-2 move the same bytes) go to the simpler
    layout: lower ZeRO stage, less recomputation, no offload, no CP, then less memory.
    """
    hw = load_hardware(hardware)
    batch = global_batch or default_global_batch(model, gpus)
    fitting: list[Plan] = []
    smallest = None
    for layout in candidate_layouts(
        model,
        gpus,
        hw,
        global_batch=batch,
        precision=precision,
        micro_batch_size=micro_batch_size,
        attention=attention,
        cps=cps,
    ):
        memory = memory_per_rank(model, layout)
        if offload and not memory.fits(hw) and layout.zero_stage:
            layout = replace(layout, optimizer_offload=True)  # ZeRO-Offload, only if needed
            memory = memory_per_rank(model, layout)
        smallest = memory.total if smallest is None else min(smallest, memory.total)
        if memory.fits(hw):
            fitting.append(plan(model, layout, hw, kernel_efficiency=kernel_efficiency))
    if not fitting:
        raise ValueError(
            f"no layout of {gpus} x {hw.key} fits {model.name}: the leanest needs "
            f"{fmt_bytes(smallest or 0)} per device of {hw.memory_gb:g} GiB; use more "
            "devices, a larger-memory part" + ("" if offload else ", or offload=True")
        )
    fitting.sort(
        key=lambda p: (
            round(p.compute.step_seconds, 6),
            p.layout.zero_stage,
            RECOMPUTE.index(p.layout.recompute),
            p.layout.optimizer_offload,
            p.layout.cp,
            p.memory.total,
        )
    )
    return [Recommendation(p.layout, p, explain(p)) for p in fitting[:top]]


def explain(p: Plan) -> str:
    """Short reason for each choice in a fitting layout."""
    model, layout, hw = p.model, p.layout, p.hardware
    reasons = []
    if layout.tp > 1:
        reasons.append(f"TP within a node ({layout.tp} of {hw.devices_per_node})")
    if layout.cp > 1:
        reasons.append(f"CP={layout.cp} splits the {model.seq_len}-token sequence (ring attention)")
    if layout.pp > 1:
        where = "across nodes" if layout.stride("pp") >= hw.devices_per_node else "in-node"
        reasons.append(f"PP {where} ({layout.pp}, bubble {p.compute.bubble:.0%})")
    if layout.ep > 1:
        reasons.append(f"EP={layout.ep}: {model.experts // layout.ep} experts per rank")
    if layout.optimizer_offload:
        reasons.append(
            f"optimizer offloaded to CPU ({p.compute.offload_seconds:.2f} s/step): without it no such layout fits"
        )
    states = total_model_state_bytes(model, layout.precision)
    split = layout.tp * layout.pp
    if layout.zero_stage:
        lower = memory_per_rank(model, _lower_zero(layout))
        if lower.fits(hw):
            reasons.append(f"ZeRO-{layout.zero_stage} over DP={layout.dp}")
        elif states / split > hw.memory_bytes:
            reasons.append(
                f"ZeRO-{layout.zero_stage} needed: model states {fmt_bytes(states)} / "
                f"TPxPP={split} = {fmt_bytes(states / split)} exceed {hw.memory_gb:g} GiB"
            )
        else:
            reasons.append(
                f"ZeRO-{layout.zero_stage} needed: ZeRO-{layout.zero_stage - 1} would need "
                f"{fmt_bytes(lower.total)} per GPU, over 90% of {hw.memory_gb:g} GiB"
            )
    elif layout.dp > 1:
        reasons.append(f"DDP over {layout.dp}")
    if layout.recompute != "none":
        plain = replace(layout, recompute="none")
        acts = memory_per_rank(model, plain)
        tag = "needed" if not acts.fits(hw) else "chosen"
        reasons.append(
            f"{layout.recompute} recompute {tag}: activations "
            f"{fmt_bytes(acts.activations)} -> {fmt_bytes(p.memory.activations)}"
        )
    return "; ".join(reasons) or "fits on one device"


def _lower_zero(layout: PlanLayout) -> PlanLayout:
    stage = layout.zero_stage - 1
    if stage == 0:
        return replace(layout, zero_stage=0, dp_replicate=layout.dp, dp_shard=1)
    return replace(layout, zero_stage=stage)


def as_frame(recommendations: list[Recommendation]):
    """One row per recommendation, for display in a notebook."""
    import pandas as pd

    return pd.DataFrame(
        [
            dict(
                layout=r.layout.describe(),
                tp=r.layout.tp,
                pp=r.layout.pp,
                dp=r.layout.dp,
                cp=r.layout.cp,
                ep=r.layout.ep,
                offload=r.layout.optimizer_offload,
                zero=r.layout.zero_stage,
                recompute=r.layout.recompute,
                memory_gb=r.plan.memory.total / 1e9,
                step_s=r.plan.compute.step_seconds,
                mfu=r.plan.compute.mfu,
                reason=r.reason,
            )
            for r in recommendations
        ]
    )
