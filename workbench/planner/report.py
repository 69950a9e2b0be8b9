"""`plan()`: one layout on one machine type, every estimate in one `Plan`.

The `Plan` is plain data (dataclasses of floats and strings) so the notebook side can
print it (`summary()`), tabulate it (`to_frame()`) or send it as an event, without
importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .communication import CommBreakdown, communication_per_step
from .compute import (
    DEFAULT_KERNEL_EFFICIENCY,
    ComputeEstimate,
    RunCost,
    estimate_compute,
    nvme_seconds,
    offload_seconds,
    run_cost,
)
from .flops import token_flops
from .hardware import Hardware, load_hardware
from .layout import PlanLayout
from .memory import (
    MemoryBreakdown,
    activation_bytes_per_layer,
    fmt_bytes,
    memory_per_rank,
    params_on_stage,
    saved_tensors,
    score_sbh,
    state_bytes,
)
from .model_spec import ModelSpec
from .pipeline import describe_in_flight, describe_stages, in_flight_layers


@dataclass(frozen=True)
class Plan:
    model: ModelSpec
    layout: PlanLayout
    hardware: Hardware
    memory: MemoryBreakdown
    comm: CommBreakdown
    compute: ComputeEstimate
    tokens: float | None = None
    cost: RunCost | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return self.memory.fits(self.hardware)

    @property
    def gpus(self) -> int:
        return self.layout.world_size

    def to_frame(self):
        """Long table: one row per (section, item) with value and unit."""
        import pandas as pd

        rows = []
        for part, nbytes in self.memory.parts().items():
            rows.append(("memory", part, nbytes / 1e9, "GB/GPU"))
        rows.append(("memory", "total", self.memory.total / 1e9, "GB/GPU"))
        rows.append(("memory", "capacity", self.hardware.memory_bytes / 1e9, "GB/GPU"))
        for item in self.comm.items:
            rows.append(("comm", f"{item.collective} ({item.group})", item.bytes / 1e9, "GB/step/GPU"))
            rows.append(("comm_time", f"{item.collective} ({item.group})", item.seconds, "s/step"))
        c = self.compute
        rows += [
            ("compute", "tokens per step", c.tokens_per_step, "tokens"),
            ("compute", "bubble", c.bubble, "fraction of compute"),
            ("compute", "compute time", c.compute_seconds, "s/step"),
            ("compute", "exposed comm", c.exposed_comm_seconds, "s/step"),
            ("compute", "step time", c.step_seconds, "s/step"),
            ("compute", "stage imbalance", c.imbalance, "fraction of compute"),
            ("compute", "offload", c.offload_seconds, "s/step"),
            ("compute", "MFU", c.mfu, "fraction"),
            ("compute", "MFU (6N + 12Lhs)", c.mfu_published, "fraction"),
            ("compute", "tokens/s", c.tokens_per_second, "tokens/s"),
        ]
        if self.cost is not None:
            rows += [
                ("cost", "days", self.cost.days, "days"),
                ("cost", "GPU-hours", self.cost.gpu_hours, "GPU-h"),
                ("cost", "cost", self.cost.usd, "USD"),
            ]
        return pd.DataFrame(rows, columns=["section", "item", "value", "unit"])

    def summary(self) -> str:
        m, hw, layout = self.memory, self.hardware, self.layout
        state = "fits" if self.fits else "DOES NOT FIT"
        lines = [
            f"plan: {self.model.name} ({self.model.params().total / 1e9:.1f}B params) on {self.gpus} x {hw.name}",
            f"layout: {layout.describe()}  [{layout.precision}]  attention: {layout.attention}",
        ]
        if layout.pp > 1:
            lines.append(f"layers per pipeline rank: {describe_stages(self.model, layout)}")
        lines.append(
            f"memory per GPU (stage {m.stage}): {fmt_bytes(m.total)} of {hw.memory_gb:g} GiB "
            f"(90% usable = {fmt_bytes(0.9 * hw.memory_bytes)}) -> {state}"
        )
        for part, v in m.parts().items():
            if v:
                lines.append(f"  {part:<12}{fmt_bytes(v):>10}{self._why_memory(part)}")
            if part == "activations" and v:
                lines.append(f"{'':>24}per layer (Korthikanti et al. 2022, this block): {self._activation_formula()}")
                in_flight = describe_in_flight(self.model, layout, m.stage)
                lines.append(f"{'':>24}in flight: {layout.schedule if layout.pp > 1 else 'no pipeline'}, {in_flight}")
        if m.cpu_offload:
            where = f"(nvme {self.layout.nvme_gbs:g} GB/s)" if self.layout.nvme_gbs else "(cpu)"
            lines.append(f"  {where:<12}{fmt_bytes(m.cpu_offload):>10} optimizer offloaded")
        lines.append(f"comm per step per GPU: {fmt_bytes(self.comm.total_bytes)}")
        for i in self.comm.items:
            where = "intra-node" if i.intra_node else "inter-node"
            lines.append(
                f"  {i.collective:<15}{i.group:<13}{fmt_bytes(i.bytes):>10}"
                f"  {i.seconds * 1e3:8.1f} ms  {where}"
                f"{'' if i.overlappable else '  (blocking)'}"
            )
        lines += self._compute_lines()
        if self.cost is not None:
            lines.append(f"cost: {self.cost}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def _why_memory(self, part: str) -> str:
        model, layout, m = self.model, self.layout, self.memory
        if part == "activations":
            per_layer = activation_bytes_per_layer(model, layout)
            held = in_flight_layers(model, layout, m.stage)
            return f" = {fmt_bytes(per_layer)}/layer x {held:g} layers in flight"
        if part in ("parameters", "gradients", "optimizer"):
            index = ("parameters", "gradients", "optimizer").index(part)
            nbytes = state_bytes(layout)[index]
            zero_from = (3, 2, 1)[index]
            count = sum(params_on_stage(model, layout, m.stage))
            if layout.zero_stage >= zero_from and layout.shard_degree > 1:
                split = f" / {layout.shard_degree} ZeRO-{layout.zero_stage}"
            elif layout.zero_stage and layout.shard_degree > 1:
                split = f", not sharded (ZeRO-{layout.zero_stage})"
            else:
                split = ""
            return f" = {nbytes} B/param{split} x {count / 1e9:.3g}B params (this rank's, before ZeRO)"
        if part == "logits":
            return " fp32 logits for the loss (last stage)"
        if part == "fp8 weights":
            return " fp8 weight + transpose copies (Transformer Engine)"
        return ""

    def _activation_formula(self) -> str:
        """The per-layer count, tensor by tensor ('31.75sbh/t = norm inputs 4 + ...')."""
        model, layout = self.model, self.layout
        t = layout.tp
        sp = layout.seq_parallel and t > 1
        per_t = "/t" if sp else ""
        if layout.recompute == "full":
            return f"2sbh{per_t} (full recompute: each layer's input)"
        fp8 = layout.precision == "fp8"
        terms = [(x.name, x.sbh / 2 if fp8 and x.matmul_input else x.sbh, x.split) for x in saved_tensors(model)]
        parts = " + ".join(f"{name} {sbh:g}" for name, sbh, _ in terms)
        total = sum(sbh for _, sbh, _ in terms)
        if sp or t == 1:
            text = f"{total:g}sbh{per_t} = {parts}"
        else:
            whole = sum(sbh for _, sbh, split in terms if not split)
            text = f"sbh({whole:g} + {total - whole:g}/t), no sequence parallel; {parts}"
        if fp8:
            text += "; linear inputs in fp8"
        if layout.attention == "eager" and layout.recompute == "none":
            return text + f"; + {score_sbh(model)}as/h scores stored (eager)"
        return text + "; no s x s scores (" + ("flash" if layout.attention == "flash" else "selective recompute") + ")"

    def _compute_lines(self) -> list[str]:
        c, layout, model = self.compute, self.layout, self.model
        per_token = token_flops(model, layout)
        peak_name = "fp8" if layout.precision == "fp8" else layout.precision
        attention_peak = "bf16" if layout.precision == "fp8" else layout.precision
        lines = [
            f"FLOPs per token: matmuls {per_token.matmul / 1e9:,.1f} G (at the {peak_name} "
            f"peak) + attention {per_token.attention / 1e9:,.1f} G ({layout.attention}, "
            f"causal{' kernel recompute' if layout.attention == 'flash' else ' computed in full'};"
            f" at the {attention_peak} peak)",
            f"compute: {c.matmul_seconds:.2f} s matmuls + {c.attention_seconds:.2f} s "
            f"attention at {c.kernel_efficiency:.0%} of peak"
            + (f", x {1 + c.imbalance:.3f} busiest stage over the mean" if c.imbalance else "")
            + f" = {c.compute_seconds:.2f} s",
            f"bubble: {c.bubble:.1%} of compute ({layout.schedule}, pp={layout.pp}, "
            f"m={layout.microbatches}"
            + (f", v={layout.virtual_stages}" if layout.schedule == "interleaved" else "")
            + ")",
            f"step: {c.step_seconds:.2f} s = compute {c.compute_seconds:.2f} s "
            f"+ bubble {c.bubble_seconds:.2f} s + exposed comm {c.exposed_comm_seconds:.2f} s"
            + (f" + offload {c.offload_seconds:.2f} s" if c.offload_seconds else ""),
            f"MFU: {c.mfu:.1%} (planner: 6 N_matmul + 6 L h s causal)   published "
            f"convention {c.mfu_published:.1%} (6N + 12 L h s, PaLM appendix B); with recompute "
            f"{c.hfu_published:.1%} (Narayanan et al. 2021); of the dense {peak_name} peak",
            f"tokens/s: {c.tokens_per_second:,.0f}   tokens/step: {c.tokens_per_step:,}   "
            f"{c.flops_per_device_per_second('published_hardware') / 1e12:,.0f} TFLOP/s per GPU "
            "(published, recompute counted)",
        ]
        return lines

    def __str__(self) -> str:
        return self.summary()


def plan(
    model: ModelSpec,
    layout: PlanLayout,
    hardware: Hardware | str,
    tokens: float | None = None,
    price: float | None = None,
    *,
    kernel_efficiency: float = DEFAULT_KERNEL_EFFICIENCY,
) -> Plan:
    """Estimate memory, communication, step time, MFU and (with tokens) cost.

    The run's days come from the ESTIMATED throughput of this layout; `price` is USD per
    GPU-hour (default: middle of the hardware's quoted range).
    """
    hw = load_hardware(hardware)
    layout.validate_for(model)
    memory = memory_per_rank(model, layout)
    comm = communication_per_step(model, layout, hw)
    offload = 0.0
    if layout.optimizer_offload:
        optimizer_params = memory.cpu_offload / state_bytes(layout)[2]
        offload = offload_seconds(optimizer_params, hw.host_link_bandwidth)
        offload += nvme_seconds(optimizer_params, layout.nvme_gbs * 1e9)
    first = estimate_compute(model, layout, hw, 0.0, kernel_efficiency)
    exposed = comm.exposed_seconds(first.compute_seconds, first.attention_seconds)
    compute = estimate_compute(model, layout, hw, exposed, kernel_efficiency, offload)
    cost = None
    if tokens is not None:
        days = tokens / compute.tokens_per_second / 86_400
        cost = run_cost(layout.world_size, days, price, hardware=hw)
    return Plan(model, layout, hw, memory, comm, compute, tokens, cost, tuple(_warnings(model, layout, hw, memory)))


def _warnings(model: ModelSpec, layout: PlanLayout, hw: Hardware, memory: MemoryBreakdown) -> list[str]:
    out = []
    if not memory.fits(hw):
        out.append(
            f"needs {fmt_bytes(memory.total)} per GPU but {hw.key} has "
            f"{hw.memory_gb:g} GiB (90% usable): raise zero_stage, tp or pp, "
            "or turn on recompute"
        )
    if layout.tp > hw.devices_per_node:
        out.append(
            f"tp={layout.tp} spans nodes ({hw.devices_per_node} per node): TP "
            "all-reduces would cross the slow inter-node links"
        )
    if layout.pp > 1 and layout.microbatches < layout.pp:
        out.append(
            f"microbatches={layout.microbatches} < pp={layout.pp}: the bubble "
            f"is {(layout.pp - 1) / layout.microbatches:.0%}; use m >= 4*pp"
        )
    if layout.zero_stage == 3 and layout.pp > 1:
        out.append(
            "ZeRO-3 with pipeline parallelism re-gathers parameters every "
            "micro-batch; ZeRO-1 is the usual partner of PP"
        )
    return out
