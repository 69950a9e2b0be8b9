"""Search layouts for a model on N devices: keep those that fit, rank by step time.

The search follows the order of the HF Ultra-Scale Playbook ("first fit a replica in
memory, then scale the batch with DP"): tensor parallelism only inside one node's
fast fabric (its all-reduces sit on the critical path of every layer), pipeline
parallelism across nodes (only point-to-point sends, at the price of a bubble), ZeRO
stages and activation recomputation as memory savers, DP with whatever is left. The
global batch is held fixed, so step times of different layouts compare like for like.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

from .compute import DEFAULT_KERNEL_EFFICIENCY
from .hardware import Hardware, load_hardware
from .layout import RECOMPUTE, PlanLayout
from .memory import fmt_bytes, memory_per_rank, total_model_state_bytes
from .model_spec import ModelSpec
from .report import Plan, plan


@dataclass(frozen=True)
class Recommendation:
    layout: PlanLayout
    plan: Plan
    reason: str

    def __str__(self) -> str:
        c = self.plan.compute
        return (f"{self.layout.describe():<48} step {c.step_seconds:6.2f} s  "
                f"MFU {c.mfu:5.1%}  mem {fmt_bytes(self.plan.memory.total):>9}  "
                f"| {self.reason}")


def default_global_batch(model: ModelSpec, gpus: int, target_tokens: float = 4 * 2**20) -> int:
    """Sequences per step: ~4M tokens (Llama 3 pre-training), a multiple of `gpus`."""
    sequences = max(1, round(target_tokens / model.seq_len))
    return -(-sequences // gpus) * gpus


def candidate_layouts(model: ModelSpec, gpus: int, hardware: Hardware, *,
                      global_batch: int, precision: str = "bf16",
                      micro_batch_size: int = 1) -> list[PlanLayout]:
    """Every (tp, pp, dp, zero, recompute, schedule) the model and batch allow."""
    out = []
    divisors = [d for d in range(1, gpus + 1) if gpus % d == 0]
    tps = [t for t in divisors if t <= hardware.devices_per_node and t <= model.heads
           and model.heads % t == 0 and model.ffn % t == 0
           and (model.kv_heads % t == 0 or t % model.kv_heads == 0)]
    for tp, pp in product(tps, divisors):
        if (gpus // tp) % pp or pp > model.layers:
            continue
        dp = gpus // (tp * pp)
        if global_batch % (dp * micro_batch_size):
            continue
        m = global_batch // (dp * micro_batch_size)
        schedules = [("1f1b", 1)]
        if pp > 1 and m % pp == 0 and model.layers % (2 * pp) == 0:
            schedules.append(("interleaved", 2))
        for zero, recompute, (schedule, v) in product(range(4), RECOMPUTE, schedules):
            if zero and dp == 1:
                continue
            shard = dict(dp_shard=dp) if zero else dict(dp_replicate=dp)
            out.append(PlanLayout(tp=tp, pp=pp, zero_stage=zero, microbatches=m,
                                  schedule=schedule, virtual_stages=v, recompute=recompute,
                                  precision=precision, micro_batch_size=micro_batch_size,
                                  **shard))
    return out


def recommend(model: ModelSpec, gpus: int, hardware: "Hardware | str", *, top: int = 5,
              global_batch: int | None = None, precision: str = "bf16",
              micro_batch_size: int = 1,
              kernel_efficiency: float = DEFAULT_KERNEL_EFFICIENCY) -> list[Recommendation]:
    """Layouts of `gpus` devices that fit in memory, fastest estimated step first.

    Ties (e.g. ZeRO-1 and ZeRO-2 move the same bytes) go to the simpler layout: lower
    ZeRO stage, less recomputation, then less memory.
    """
    hw = load_hardware(hardware)
    batch = global_batch or default_global_batch(model, gpus)
    fitting: list[Plan] = []
    smallest = None
    for layout in candidate_layouts(model, gpus, hw, global_batch=batch, precision=precision,
                                    micro_batch_size=micro_batch_size):
        memory = memory_per_rank(model, layout)
        smallest = memory.total if smallest is None else min(smallest, memory.total)
        if memory.fits(hw):
            fitting.append(plan(model, layout, hw, kernel_efficiency=kernel_efficiency))
    if not fitting:
        raise ValueError(
            f"no layout of {gpus} x {hw.key} fits {model.name}: the leanest needs "
            f"{fmt_bytes(smallest or 0)} per device of {hw.memory_gb:g} GB; use more "
            "devices, a larger-memory part, or optimizer_offload"
        )
    fitting.sort(key=lambda p: (round(p.compute.step_seconds, 6), p.layout.zero_stage,
                                RECOMPUTE.index(p.layout.recompute), p.memory.total))
    return [Recommendation(p.layout, p, explain(p)) for p in fitting[:top]]


def explain(p: Plan) -> str:
    """Short reason for each choice in a fitting layout."""
    model, layout, hw = p.model, p.layout, p.hardware
    reasons = []
    if layout.tp > 1:
        reasons.append(f"TP within a node ({layout.tp} of {hw.devices_per_node})")
    if layout.pp > 1:
        where = "across nodes" if layout.stride("pp") >= hw.devices_per_node else "in-node"
        reasons.append(f"PP {where} ({layout.pp}, bubble {p.compute.bubble:.0%})")
    states = total_model_state_bytes(model, layout.precision)
    split = layout.tp * layout.pp
    if layout.zero_stage:
        lower = memory_per_rank(model, _lower_zero(layout))
        if lower.fits(hw):
            reasons.append(f"ZeRO-{layout.zero_stage} over DP={layout.dp}")
        elif states / split > hw.memory_bytes:
            reasons.append(
                f"ZeRO-{layout.zero_stage} needed: model states {fmt_bytes(states)} / "
                f"TPxPP={split} = {fmt_bytes(states / split)} exceed {hw.memory_gb:g} GB")
        else:
            reasons.append(
                f"ZeRO-{layout.zero_stage} needed: ZeRO-{layout.zero_stage - 1} would need "
                f"{fmt_bytes(lower.total)} per GPU, over 90% of {hw.memory_gb:g} GB")
    elif layout.dp > 1:
        reasons.append(f"DDP over {layout.dp}")
    if layout.recompute != "none":
        plain = replace(layout, recompute="none")
        acts = memory_per_rank(model, plain)
        tag = "needed" if not acts.fits(hw) else "chosen"
        reasons.append(f"{layout.recompute} recompute {tag}: activations "
                       f"{fmt_bytes(acts.activations)} -> {fmt_bytes(p.memory.activations)}")
    return "; ".join(reasons) or "fits on one device"


def _lower_zero(layout: PlanLayout) -> PlanLayout:
    stage = layout.zero_stage - 1
    if stage == 0:
        return replace(layout, zero_stage=0, dp_replicate=layout.dp, dp_shard=1)
    return replace(layout, zero_stage=stage)


def as_frame(recommendations: list[Recommendation]):
    """One row per recommendation, for display in a notebook."""
    import pandas as pd

    return pd.DataFrame([
        dict(layout=r.layout.describe(), tp=r.layout.tp, pp=r.layout.pp, dp=r.layout.dp,
             zero=r.layout.zero_stage, recompute=r.layout.recompute,
             memory_gb=r.plan.memory.total / 1e9, step_s=r.plan.compute.step_seconds,
             mfu=r.plan.compute.mfu, reason=r.reason)
        for r in recommendations
    ])
