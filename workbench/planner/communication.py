"""Communication per training step per rank, by collective, and how long it takes.

Bytes are what one rank sends per optimizer step under ring algorithms, over the link its
group uses (scale-up fabric inside a node, the NIC across); large-message estimates, latency
left out. Who sends what under each parallelism, with sources: docs/planner.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

from .hardware import Hardware
from .layout import MESH_DIM_NAMES, PlanLayout
from .memory import STATE_BYTES, params_on_stage
from .model_spec import ModelSpec


@dataclass(frozen=True)
class CommItem:
    """One kind of collective on one mesh group, summed over a step."""

    collective: str
    group: str
    group_size: int
    bytes: float
    intra_node: bool
    seconds: float
    overlappable: bool
    why: str


@dataclass(frozen=True)
class CommBreakdown:
    items: tuple[CommItem, ...] = field(default=())

    @property
    def total_bytes(self) -> float:
        return sum(i.bytes for i in self.items)

    @property
    def total_seconds(self) -> float:
        return sum(i.seconds for i in self.items)

    def by_collective(self) -> dict[str, float]:
        """Bytes per rank per step summed by collective name."""
        out: dict[str, float] = {}
        for item in self.items:
            out[item.collective] = out.get(item.collective, 0.0) + item.bytes
        return out

    def exposed_seconds(self, compute_seconds: float, attention_seconds: float | None = None) -> float:
        """Communication time not hidden behind compute.

        Data-parallel syncs and ZeRO-3 gathers are issued asynchronously and overlap
        compute (bucketing / prefetch); ring-attention sends overlap only the attention
        kernels they feed (`attention_seconds`, when given); TP, PP and EP
        communication sits on the critical path and is counted in full.
        """
        ring = sum(i.seconds for i in self.items if i.overlappable and i.group == "cp")
        hidden = sum(i.seconds for i in self.items if i.overlappable and i.group != "cp")
        blocking = sum(i.seconds for i in self.items if not i.overlappable)
        if attention_seconds is None:
            hidden += ring
            ring = 0.0
        else:
            ring = max(0.0, ring - attention_seconds)
        return blocking + ring + max(0.0, hidden - compute_seconds)


def ring_bytes(collective: str, n: int, buffer_bytes: float) -> float:
    """Bytes one rank sends in a ring collective over n ranks on a B-byte buffer."""
    if n <= 1:
        return 0.0
    factor = {"all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0, "all_to_all": 1.0}[collective]
    return factor * (n - 1) / n * buffer_bytes


def group_is_intra_node(layout: PlanLayout, dims: tuple[str, ...], hardware: Hardware, size: int | None = None) -> bool:
    """True if a group over `dims` (adjacent mesh dims) stays inside one node.

    Ranks are numbered row-major over (pp, dp_replicate, dp_shard, cp, tp), and nodes
    hold consecutive ranks, so the group spans stride(innermost dim) * group size ranks.
    """
    innermost = max(dims, key=MESH_DIM_NAMES.index)
    if size is None:
        size = prod(layout.mesh_shape()[MESH_DIM_NAMES.index(d)] for d in dims)
    return layout.stride(innermost) * size <= hardware.devices_per_node


def communication_per_step(model: ModelSpec, layout: PlanLayout, hardware: Hardware) -> CommBreakdown:
    layout.validate_for(model)
    items: list[CommItem] = []

    def add(
        collective: str, group: str, dims: tuple[str, ...], n: int, nbytes: float, overlappable: bool, why: str
    ) -> None:
        if n <= 1 or nbytes <= 0:
            return
        intra = group_is_intra_node(layout, dims, hardware, n)
        seconds = nbytes / hardware.link_bandwidth(intra)
        items.append(CommItem(collective, group, n, nbytes, intra, seconds, overlappable, why))

    p_bytes, g_bytes, _ = STATE_BYTES[layout.precision]
    act_bytes = 4 if layout.precision == "fp32" else 2
    m = layout.microbatches
    params = max(sum(params_on_stage(model, layout, s)) for s in range(layout.pp))
    grads_b = params * g_bytes
    params_b = params * (1 if layout.precision == "fp8" and layout.zero_stage == 3 else p_bytes)

    # ---- data parallel / ZeRO
    n = layout.grad_sync_degree
    dp_dims = ("dp_replicate", "dp_shard", "cp")
    if layout.zero_stage == 0:
        add(
            "all_reduce",
            "dp",
            dp_dims,
            n,
            ring_bytes("all_reduce", n, grads_b),
            True,
            "DDP gradient all-reduce, once per step",
        )
    else:
        s, r = layout.shard_degree, layout.dp_replicate
        shard_dims = ("dp_shard", "cp")
        add(
            "reduce_scatter",
            "dp_shard",
            shard_dims,
            s,
            ring_bytes("reduce_scatter", s, grads_b),
            True,
            f"ZeRO-{layout.zero_stage} gradient reduce-scatter",
        )
        add(
            "all_reduce",
            "dp_replicate",
            ("dp_replicate",),
            r,
            ring_bytes("all_reduce", r, grads_b / s),
            True,
            "HSDP: gradient shard all-reduced across replicas",
        )
        gathers = 2 * m if layout.zero_stage == 3 else 1
        why = (
            "ZeRO-3 parameter all-gather, forward and backward of each micro-batch"
            if layout.zero_stage == 3
            else "updated parameter shards all-gathered"
        )
        add("all_gather", "dp_shard", shard_dims, s, gathers * ring_bytes("all_gather", s, params_b), True, why)

    # ---- tensor parallel
    s_local = model.seq_len / layout.cp
    b = layout.micro_batch_size
    layers = layout.layers_per_stage(model)
    activation = s_local * b * model.hidden * act_bytes
    # 2 collectives in forward + 2 in backward per layer, +2 when full recompute reruns
    # the forward (with SP each is an all-gather + a reduce-scatter of the same volume)
    count = layers * m * (6 if layout.recompute == "full" else 4)
    t = layout.tp
    if layout.seq_parallel:
        for coll in ("all_gather", "reduce_scatter"):
            add(
                coll,
                "tp",
                ("tp",),
                t,
                count * ring_bytes(coll, t, activation),
                False,
                f"sequence-parallel {coll.replace('_', '-')}, {count // (layers * m)} per layer",
            )
    else:
        add(
            "all_reduce",
            "tp",
            ("tp",),
            t,
            count * ring_bytes("all_reduce", t, activation),
            False,
            f"Megatron TP all-reduce, {count // (layers * m)} per layer",
        )

    # ---- context parallel (ring attention)
    if layout.cp > 1:
        kv = 2 * s_local * b * max(model.kv_heads / t, 1) * model.head_dim * act_bytes
        hops = (layout.cp - 1) * (4 if layout.recompute == "full" else 3)
        add(
            "send_recv",
            "cp",
            ("cp",),
            layout.cp,
            hops * kv * layers * m,
            True,
            "ring attention: K/V chunks forward, K/V and grads backward",
        )

    # ---- pipeline parallel
    if layout.pp > 1:
        boundary = s_local * b * model.hidden / t * act_bytes
        sends = 2 * m * layout.virtual_stages
        add(
            "send_recv",
            "pp",
            ("pp",),
            layout.pp,
            sends * boundary,
            False,
            "pipeline activations forward, gradients backward",
        )

    # ---- expert parallel
    if layout.ep > 1:
        tokens = s_local * b / (t if layout.seq_parallel else 1)
        routed = tokens * model.top_k * model.hidden * act_bytes
        a2a = layers * m * (6 if layout.recompute == "full" else 4)
        ep_intra = layout.stride("dp_shard") * layout.ep <= hardware.devices_per_node
        nbytes = a2a * ring_bytes("all_to_all", layout.ep, routed)
        items.append(
            CommItem(
                "all_to_all",
                "ep",
                layout.ep,
                nbytes,
                ep_intra,
                nbytes / hardware.link_bandwidth(ep_intra),
                False,
                "MoE token dispatch and combine, forward and backward",
            )
        )
    return CommBreakdown(tuple(items))
