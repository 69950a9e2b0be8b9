"""Plan the model that is on the live ranks, and set the plan beside what they hold.

Notebook side, pure: no torch import. The ranks run one step under a census
(:mod:`workbench.engine.memory_census`) and send plain dicts; here their model becomes a
:class:`ModelSpec`, their strategy a :class:`PlanLayout` (the mapping: docs/planner.md),
and :func:`compare` builds the "predicted vs measured" table."""

from __future__ import annotations

from .layout import PlanLayout
from .memory import activation_bytes_per_layer, fmt_bytes, in_flight_layers, logits_bytes, model_state_bytes
from .model_spec import ModelSpec

__all__ = ["model_spec_from_config", "layout_from_spec", "compare", "PARTS", "TOLERANCE"]

PARTS = ("parameters", "gradients", "optimizer", "activations")
TOLERANCE = 0.10  # |ratio - 1| above this gets an explanation
_RING = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
}


# ------------------------------------------------------------------------ mapping
def model_spec_from_config(config: dict, seq_len: int | None = None) -> ModelSpec:
    """A planner ModelSpec for a GPTConfig / MoEConfig sent as a plain dict (see
    :func:`config_dict`). The GPT here is the Llama layout the planner counts
    (RMSNorm, no biases, GQA, SwiGLU), so the parameter counts are exact; an MoE with
    ``moe_every > 1`` is counted as if every block were MoE (an over-estimate)."""
    gpt = config.get("gpt", config)
    experts = int(config.get("n_experts", 1))
    return ModelSpec(
        layers=int(gpt["n_layers"]),
        hidden=int(gpt["dim"]),
        heads=int(gpt["n_heads"]),
        kv_heads=int(gpt["kv_heads"]),
        ffn=int(gpt["hidden_dim"]),
        vocab=int(gpt["vocab"]),
        seq_len=int(seq_len or gpt["max_seq_len"]),
        experts=experts,
        top_k=int(config.get("top_k", 1)) if experts > 1 else 1,
        tied_embeddings=bool(gpt.get("tie_embeddings", False)),
        gated_mlp=True,
        name=config.get("name") or ("moe-gpt" if experts > 1 else "gpt"),
    )


def layout_from_spec(spec: dict, world_size: int, *, micro_batch_size: int = 1, attention: str = "flash") -> PlanLayout:
    """A PlanLayout for a RESOLVED StrategySpec (as a dict) on ``world_size`` ranks, with
    the attention kernel the census measured ("flash" or "eager")."""
    kind = spec["kind"]
    dtype = spec.get("param_dtype", "fp32")
    precision = "fp32" if dtype == "fp32" else dtype
    ac = spec.get("activation_checkpointing", "none")
    common = dict(
        precision=precision,
        attention=attention,
        recompute=ac if ac in ("none", "full", "selective") else "none",
        micro_batch_size=max(1, int(micro_batch_size)),
        seq_parallel=bool(spec.get("sequence_parallel", True)),
    )
    fsdp_stage = 3 if spec.get("reshard_after_forward", True) else 2
    if kind == "none":
        return PlanLayout(**common)
    if kind == "ddp":
        return PlanLayout(dp_replicate=world_size, **common)
    if kind == "fsdp2":
        r = int(spec.get("dp_replicate", 1))
        s = int(spec["dp_shard"]) if spec.get("dp_shard", -1) != -1 else world_size // r
        if s == 1:  # replicate only: FSDP2 degenerates to DDP
            return PlanLayout(dp_replicate=r, **common)
        ep = int(spec.get("ep", 1))  # experts split over ep, borrowed from dp_shard
        return PlanLayout(dp_replicate=r, dp_shard=s, zero_stage=fsdp_stage, ep=ep, **common)
    if kind == "zero":
        stage = int(spec.get("zero_stage", 2))
        if stage == 0 or world_size == 1:
            return PlanLayout(dp_replicate=world_size, **common)
        return PlanLayout(dp_shard=world_size, zero_stage=stage, **common)
    if kind == "tp":
        return PlanLayout(tp=world_size if spec.get("tp", 1) == 1 else int(spec["tp"]), **common)
    if kind == "fsdp2_tp":
        t = int(spec["tp"])
        s = int(spec["dp_shard"]) if spec.get("dp_shard", -1) != -1 else world_size // t
        return PlanLayout(dp_shard=s, tp=t, zero_stage=fsdp_stage if s > 1 else 0, **common)
    if kind == "pp":
        pp = world_size if spec.get("pp", 1) == 1 else int(spec["pp"])
        m = spec.get("pp_microbatches") or 2 * pp
        mbs = max(1, int(micro_batch_size) // int(m))
        common["micro_batch_size"] = mbs
        return PlanLayout(
            pp=pp,
            microbatches=int(m),
            schedule=spec.get("pp_schedule", "1f1b") if spec.get("pp_schedule") in ("1f1b", "gpipe") else "1f1b",
            **common,
        )
    raise ValueError(f"no planner layout for strategy kind {kind!r}")


def _rank_stage(layout: PlanLayout, rank: int) -> int:
    return layout.coordinate(rank)["pp"] if layout.pp > 1 else 0


def predicted_parts(model: ModelSpec, layout: PlanLayout, rank: int) -> dict[str, float]:
    """The planner's bytes for one rank: model states of its stage, activations + logits."""
    stage = _rank_stage(layout, rank)
    params, grads, optim, _ = model_state_bytes(model, layout, stage)
    acts = activation_bytes_per_layer(model, layout) * in_flight_layers(model, layout, stage)
    if stage == layout.pp - 1:
        acts += logits_bytes(model, layout)
    return {"parameters": params, "gradients": grads, "optimizer": optim, "activations": acts}


def implementation_terms(model: ModelSpec, layout: PlanLayout, census: dict, rank: int) -> dict[str, tuple[float, str]]:
    """Known per-implementation bytes the planner does not count: {part: (bytes, why)}."""
    out: dict[str, tuple[float, str]] = {}
    if layout.tp > 1 and _rank_stage(layout, rank) == layout.pp - 1:
        out["activations"] = (
            logits_bytes(model, layout) * (layout.tp - 1),
            "the workbench's TP returns the logits replicated (ColwiseParallel output Replicate): "
            "every TP rank holds the full fp32 logits, tp x the planner's 4sbV/t (included in predicted)",
        )
    if census.get("path") != "deepspeed" or layout.zero_stage == 0:
        return out
    shard = model.params().total / layout.shard_degree  # parameters in this rank's partition
    if layout.precision == "fp32":
        out["optimizer"] = (
            4 * shard,
            "DeepSpeed keeps an fp32 master partition even for an fp32 model (+4 B/param/shard, included in predicted)",
        )
    if layout.zero_stage == 3:
        out["gradients"] = (
            4 * shard,
            "DeepSpeed ZeRO-3 flattens the gradient partition into an fp32 copy "
            "for the update (+4 B/param/shard, included in predicted)",
        )
    return out


def _explain(part: str, census: dict, layout: PlanLayout, ratio: float | None) -> str:
    """Why measured and predicted differ by more than TOLERANCE (best-known causes)."""
    kind, path = census.get("strategy"), census.get("path")
    if ratio is None:
        return "not measured on this rank"
    if abs(ratio - 1) <= TOLERANCE:
        return ""
    why: list[str] = []
    if part == "activations":
        why.append(
            "the planner counts this block's saved tensors (Korthikanti et al. 2022's inventory) in "
            "16-bit, doubled here for fp32, and leaves out the embedding output, the final norm and "
            "the loss's saved tensors; the measurement counts each saved storage once"
        )
        if layout.recompute != "none":
            why.append("with activation checkpointing the recomputed forward's saved tensors are counted too")
        if layout.pp > 1:
            why.append(
                "pipeline stages save the tensors of every micro-batch of the step (all packed during "
                "the step), not the in-flight peak of the schedule"
            )
    elif part == "parameters":
        if kind in ("fsdp2", "fsdp2_tp") and ratio < 1 and layout.zero_stage == 2:
            why.append(
                "reshard_after_forward=False (mapped to ZeRO-2) keeps the gathered parameters only "
                "from forward to backward; at rest, where the census counts, FSDP2 parameters are "
                "sharded"
            )
        elif kind in ("fsdp2", "fsdp2_tp"):
            why.append("FSDP2 pads each parameter's dim 0 to a multiple of the shard count")
        if path == "deepspeed":
            why.append("DeepSpeed flat buffers with partition/alignment padding")
        if layout.tp > 1:
            why.append("norm weights are replicated on every TP rank")
    elif part == "gradients":
        if layout.tp > 1 and ratio > 1:
            why.append(
                "the row-sharded embedding's gradient comes back as a Replicate() DTensor: every TP "
                "rank holds the whole vocab x dim gradient (measured on torch 2.x: tok_embeddings.weight)"
            )
        if path == "deepspeed":
            why.append(
                "DeepSpeed moves gradients between param.grad, its reduce buckets and partition buffers; "
                "the census takes the larger of the end of backward and just before the update"
            )
        if kind == "ddp":
            why.append("DDP's reducer buckets (C++-owned, about one more gradient copy) are not visible")
    elif part == "optimizer":
        if path == "deepspeed":
            why.append("DeepSpeed fp32 master partitions and padded flat groups")
        why.append("Adam's scalar step tensors and allocator/storage rounding")
    elif part == "buffers":
        why.append(
            "DeepSpeed allocates its gradient reduction bucket whole at reduce_bucket_size (5e8 "
            "elements by default; on CPU only the touched pages are resident)"
        )
    elif part.startswith("comm"):
        coll = part.split(" ", 1)[1]
        measured = (census.get("comm") or {}).get(coll, {}).get("bytes", 0)
        if ratio == 99.0 and measured < 1024:
            why.append("scalars (the loss average, grad-norm) are outside the planner's model")
        elif path == "deepspeed" and layout.zero_stage in (1, 2) and coll in ("all_reduce", "reduce_scatter"):
            why.append(
                "DeepSpeed ZeRO-1/2 reduces gradient buckets with all_reduce, not reduce_scatter "
                "(the planner's reduce_scatter row)"
            )
        elif path == "deepspeed" and coll == "all_gather":
            why.append(
                "DeepSpeed ZeRO-3 gathered more than forward + backward once each (parameters "
                "re-fetched outside the prefetch order, e.g. on the first steps while it records "
                "the trace)"
            )
        elif layout.tp > 1 and coll in ("all_gather", "reduce_scatter", "all_reduce") and ratio < 1:
            why.append(
                "tensor-parallel collectives (the planner counts them in this row) run as DTensor "
                "functional collectives (torch.ops._c10d_functional), which comm_timing does not see"
            )
        elif kind == "ddp" and ratio < 0.5:
            why.append(
                "DDP's bucket all-reduces run in C++; they are seen only through DDP's reducer clock (comm_timing.watch_ddp), not read here"
            )
        else:
            why.append(
                "measured bytes are the buffers handed to each collective, predicted the planner's "
                "ring volume turned back into buffer size; gloo runs reduce-scatter as an "
                "all-reduce of the full buffer on CPU (same buffer, twice the traffic)"
            )
    return "; ".join(why) or "no known cause: worth a look"


def compare(censuses: list[dict], *, seq_len: int | None = None) -> pd.DataFrame:  # noqa: F821 (pandas is imported inside)
    """The "predicted vs measured" table from the ranks' census dicts (one per rank).

    Columns: rank, part, planner_bytes, predicted_bytes, measured_bytes, ratio
    (measured / predicted), explanation, measured_when.
    """
    import pandas as pd

    rows = []
    for c in censuses:
        b, t = int(c["batch_shape"][0]), int(c["batch_shape"][1])
        model = model_spec_from_config(c["model_config"], seq_len=seq_len or t)
        layout = layout_from_spec(
            c["spec"], c["world_size"], micro_batch_size=b, attention=c.get("attention") or "flash"
        )
        pred = predicted_parts(model, layout, c["rank"])
        extra = implementation_terms(model, layout, c, c["rank"])
        parts = list(PARTS) + (["buffers"] if c["bytes"].get("buffers") else [])
        for part in parts:
            planner = float(pred.get(part, 0.0))
            add, note = extra.get(part, (0.0, ""))
            predicted = planner + add
            measured = c["bytes"].get(part)
            ratio = (measured / predicted) if measured is not None and predicted else None
            expl = _explain(part, c, layout, ratio) if predicted else _explain(part, c, layout, 99.0)
            rows.append(
                {
                    "rank": c["rank"],
                    "part": part,
                    "planner_bytes": planner,
                    "predicted_bytes": predicted,
                    "measured_bytes": measured,
                    "ratio": ratio,
                    "explanation": "; ".join(x for x in (note, expl) if x),
                    "measured_when": c.get("measured", {}).get(part, ""),
                }
            )
        rows += _comm_rows(c, model, layout)
    return pd.DataFrame(
        rows,
        columns=[
            "rank",
            "part",
            "planner_bytes",
            "predicted_bytes",
            "measured_bytes",
            "ratio",
            "explanation",
            "measured_when",
        ],
    )


def _comm_rows(c: dict, model: ModelSpec, layout: PlanLayout) -> list[dict]:
    """Communication per step by collective: planner ring bytes turned back into the
    buffer sizes handed to the collectives, beside the buffers the rank counted."""
    measured = c.get("comm")
    if measured is None:
        return []
    from .communication import communication_per_step
    from .hardware import load_hardware

    predicted: dict[str, float] = {}
    for item in communication_per_step(model, layout, load_hardware("h100")).items:
        factor = _RING.get(item.collective, lambda n: 1.0)(item.group_size)
        predicted[item.collective] = predicted.get(item.collective, 0.0) + (item.bytes / factor if factor else 0.0)
    rows = []
    for kind in sorted(set(predicted) | {k for k in measured if k in _RING}):
        got = measured.get(kind, {}).get("bytes", 0)
        want = predicted.get(kind, 0.0)
        ratio = got / want if want else None
        expl = _explain(f"comm {kind}", c, layout, ratio if ratio is not None else 99.0)
        rows.append(
            {
                "rank": c["rank"],
                "part": f"comm {kind}",
                "planner_bytes": want,
                "predicted_bytes": want,
                "measured_bytes": got,
                "ratio": ratio,
                "explanation": expl,
                "measured_when": c.get("measured", {}).get("comm", ""),
            }
        )
    return rows


# ------------------------------------------------------------------------ live ranks
def config_dict(cfg) -> dict:
    """A GPTConfig / MoEConfig as the plain dict :func:`model_spec_from_config` reads."""

    def gpt_part(g) -> dict:
        return {
            "vocab": g.vocab,
            "dim": g.dim,
            "n_layers": g.n_layers,
            "n_heads": g.n_heads,
            "kv_heads": g.kv_heads,
            "hidden_dim": g.hidden_dim,
            "max_seq_len": g.max_seq_len,
            "tie_embeddings": g.tie_embeddings,
        }

    if cfg is None:
        return {}
    if hasattr(cfg, "n_experts"):
        return {
            "gpt": gpt_part(cfg.gpt),
            "n_experts": cfg.n_experts,
            "top_k": cfg.top_k,
            "moe_every": getattr(cfg, "moe_every", 1),
        }
    return gpt_part(cfg)


def format_table(table) -> str:
    """Compact text of the comparison: sizes in human units, ratio to two places."""
    if table.empty:
        return "(no rows)"
    ranks = sorted(set(table["rank"]))
    note = ""
    if len(ranks) > 1:
        first = table[table["rank"] == ranks[0]][["part", "predicted_bytes", "measured_bytes"]].reset_index(drop=True)
        same = all(
            table[table["rank"] == r][["part", "predicted_bytes", "measured_bytes"]]
            .reset_index(drop=True)
            .equals(first)
            for r in ranks[1:]
        )
        if same:
            table = table[table["rank"] == ranks[0]]
            note = f"\n(ranks {ranks[1]}-{ranks[-1]}: the same bytes as rank {ranks[0]})"
    shown = table.assign(
        predicted=table["predicted_bytes"].map(fmt_bytes),
        measured=table["measured_bytes"].map(lambda v: "-" if v is None else fmt_bytes(v)),
        ratio=table["ratio"].map(lambda r: "-" if r is None or r != r else f"{r:.2f}"),
        explanation=table["explanation"].map(lambda e: (e[:90] + "...") if len(e) > 93 else e),
    )[["rank", "part", "predicted", "measured", "ratio", "explanation"]]
    return shown.to_string(index=False) + note
