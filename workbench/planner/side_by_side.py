"""A dry run beside the planner: the same terms, per rank position, for the same layout.

The dry run's resolved layout and the facts it read off the laid-out model become a
:class:`PlanLayout` and a :class:`ModelSpec`; each term then has two planner numbers: the
**planner**'s with those facts, and the **paper**'s (the planner's defaults for the same
degrees). Terms more than :data:`FLAG` apart are flagged with their module or term and why
the paper differs. Pure arithmetic (no torch). See docs/dry-run.md."""

from __future__ import annotations

from dataclasses import replace

from .layout import PlanLayout
from .memory import (
    activation_bytes_per_layer,
    logits_bytes,
    model_state_bytes,
    param_terms_on_stage,
    pipeline_fsdp_bytes,
    state_bytes,
)
from .model_spec import ModelSpec
from .pipeline import in_flight_layers, rank_layers

__all__ = [
    "FLAG",
    "MODULE_TERMS",
    "module_term",
    "planner_model",
    "planner_layout",
    "position_terms",
    "compare_rows",
    "term_effects",
]

FLAG = 0.05  # |dry run / planner - 1| above this is flagged
MODULE_TERMS = ("embedding", "attention", "mlp", "norms", "head")
_STATE_TERMS = ("parameters", "gradients", "optimizer")


def module_term(name: str) -> str:
    """The planner's parameter term of a parameter name (``model.layers.*.mlp.up_proj.weight``
    -> ``mlp``): embedding, attention, mlp, norms, head, or other."""
    parts = name.lower().split(".")
    owner = parts[-2] if len(parts) > 1 else parts[-1]
    low = name.lower()
    if "norm" in owner:
        return "norms"
    if "embed" in low or owner in ("wte", "tok_embeddings"):
        return "embedding"
    if owner in ("lm_head", "output", "head"):
        return "head"
    if "attn" in low or "attention" in low:
        return "attention"
    if any(k in low for k in ("mlp", "feed_forward", "ffn", "expert", "router", "gate")):
        return "mlp"
    return "other"


def planner_model(shape: dict, implementation: str) -> ModelSpec:
    """A ModelSpec from the dry run's model shape (``ModelSpec`` fields)."""
    return ModelSpec(
        **{k: shape[k] for k in shape if k != "name"}, name=shape.get("name", "custom"), implementation=implementation
    )


def planner_layout(spec: dict, world: int, *, batch: int, facts: dict, stages: tuple[int, ...] | None) -> PlanLayout:
    """The PlanLayout of a resolved ``StrategySpec`` dict as the dry run laid it out.

    ``batch``: sequences per data-parallel rank in the step; ``stages``: blocks per
    pipeline stage as split; ``facts``: ``sequence_parallel``, ``embedding_tp``,
    ``logits_tp``, ``attention``. FSDP2 is ZeRO-3 (ZeRO-2 with ``reshard_after_forward``
    off); the workbench keeps fp32 parameters in every layout (``master_params``)."""
    tp, pp, cp, ep = (int(spec.get(k, 1)) for k in ("tp", "pp", "cp", "ep"))
    rep, shard = int(spec.get("dp_replicate", 1)), int(spec.get("dp_shard", 1))
    fsdp = shard * cp > 1 or (spec["kind"] in ("fsdp2", "fsdp2_tp") and shard > 1)
    zero = (3 if spec.get("reshard_after_forward", True) else 2) if fsdp else 0
    m = int(spec.get("pp_microbatches") or 2 * pp) if pp > 1 else 1
    ac = spec.get("activation_checkpointing", "none")
    return PlanLayout(
        dp_replicate=rep,
        dp_shard=shard,
        zero_stage=zero,
        tp=tp,
        pp=pp,
        cp=cp,
        ep=ep,
        microbatches=m,
        schedule=spec.get("pp_schedule", "1f1b") if pp > 1 else "1f1b",
        precision="fp32" if spec.get("param_dtype", "fp32") == "fp32" else "bf16",
        recompute="full" if ac == "full" else "none",
        micro_batch_size=max(1, batch // m),
        seq_parallel=bool(facts.get("sequence_parallel", False)),
        attention=facts.get("attention", "flash"),
        stage_layers=tuple(stages) if pp > 1 and stages else None,
        embedding_tp=bool(facts.get("embedding_tp", True)),
        logits_tp=bool(facts.get("logits_tp", True)),
        master_params=True,
    )


def paper_layout(layout: PlanLayout) -> PlanLayout:
    """The same degrees with the planner's defaults for everything the dry run read off."""
    return replace(layout, embedding_tp=True, logits_tp=True, master_params=False)


def _shard(layout: PlanLayout, from_stage: int) -> int:
    return layout.shard_degree if layout.zero_stage >= from_stage else 1


def position_terms(model: ModelSpec, layout: PlanLayout, stage: int) -> dict[str, float]:
    """The planner's bytes for one rank of ``stage``: model states, per-module parameters,
    activations in flight, the loss's logits, FSDP's buffers under a pipeline, their sum
    (``peak``), and ``saved`` (what the step saves for backward over all its micro-batches)."""
    params, grads, optim, _ = model_state_bytes(model, layout, stage)
    p_bytes = state_bytes(layout)[0]
    per_layer = activation_bytes_per_layer(model, layout)
    acts = per_layer * in_flight_layers(model, layout, stage)
    last = stage == layout.pp - 1
    logits = logits_bytes(model, layout) if last else 0.0
    held = pipeline_fsdp_bytes(model, layout, stage)
    out = {"parameters": params, "gradients": grads, "optimizer": optim}
    for term, count in param_terms_on_stage(model, layout, stage).items():
        out[term] = count * p_bytes / _shard(layout, 3)
    out["activations"] = acts
    out["logits"] = logits
    out["gathered across micro-batches"] = held
    out["peak"] = params + grads + optim + acts + logits + held
    saved = per_layer * rank_layers(model, layout)[stage]
    out["saved"] = (saved + (_loss_saved(model, layout) if last else 0.0)) * layout.microbatches
    return out


def _loss_saved(model: ModelSpec, layout: PlanLayout) -> float:
    """What the final norm, the head and the loss save for backward in one micro-batch: the
    log-softmax's fp32 output (4 B a logit) and the head's input (2 sbh; transformers' norm
    keeps its fp32 input and output beside it: 8 sbh)."""
    s, b = model.seq_len / layout.cp, layout.micro_batch_size
    sp = layout.seq_parallel and layout.tp > 1
    norm = (8 if model.implementation == "transformers" else 2) * s * b * model.hidden / (layout.tp if sp else 1)
    return norm + 4 * s * b * model.vocab / (layout.tp if layout.logits_tp else 1)


WHY = {
    "embedding_tp": "the tensor-parallel plan leaves the embedding whole on every tp rank; the paper splits it by vocabulary (PlanLayout.embedding_tp=False)",
    "master_params": "the parameters are the fp32 master copy and the gradients fp32, the optimizer holds Adam's two moments: 4 + 4 + 8 B/param where the paper counts 2 + 2 + 12 (PlanLayout.master_params)",
    "implementation": "transformers' modules save each norm's input in fp32 and its output, the SiLU output and attention's log-sum-exp beside the paper's tensors (ModelSpec.implementation='transformers')",
    "logits_tp": "the logits are gathered whole to every tp rank and the loss keeps them with fp32 log-softmax output and gradients, 14 B a logit where the paper counts 4/t (PlanLayout.logits_tp=False, ModelSpec.implementation)",
}


def term_effects(model: ModelSpec, layout: PlanLayout, stage: int) -> dict[str, float]:
    """How much each term read off the dry run moves the paper's peak of ``stage``, set alone:
    ``{"embedding_tp": bytes, "logits_tp": ..., "master_params": ..., "implementation": ...}``."""
    paper_model = replace(model, implementation="megatron")
    base_layout = paper_layout(layout)
    base = position_terms(paper_model, base_layout, stage)["peak"]
    out = {}
    for knob in ("embedding_tp", "logits_tp", "master_params"):
        alone = replace(base_layout, **{knob: getattr(layout, knob)})
        out[knob] = position_terms(paper_model, alone, stage)["peak"] - base
    out["implementation"] = position_terms(model, base_layout, stage)["peak"] - base
    return out


def _paper_why(term: str, model: ModelSpec, layout: PlanLayout, stage: int) -> list[str]:
    """The gained terms that make the paper's number for ``term`` differ."""
    why = []
    if term in ("embedding", "peak") and stage == 0 and layout.tp > 1 and not layout.embedding_tp:
        why.append("embedding_tp")
    if term in (*_STATE_TERMS, *MODULE_TERMS, "peak") and layout.master_params:
        why.append("master_params")
    if term in ("activations", "saved", "peak") and model.implementation == "transformers":
        why.append("implementation")
    if (
        term in ("logits", "peak")
        and stage == layout.pp - 1
        and (not layout.logits_tp or model.implementation == "transformers")
    ):
        why.append("logits_tp")
    return why


def compare_rows(position: dict, model: ModelSpec, layout: PlanLayout) -> list[dict]:
    """Rows for one dry-run position (a :class:`workbench.shared.dry_run.Position` dict):
    each term with the dry run's bytes, the planner's, the paper's, their ratio, whether it
    is flagged, where it comes from and why the paper differs."""
    stage = int(position["stage"])
    ours = position_terms(model, layout, stage)
    paper_model = replace(model, implementation="megatron")
    paper = position_terms(paper_model, paper_layout(layout), stage)
    by_term: dict[str, list[str]] = {}
    dry_modules: dict[str, float] = {}
    for name, nbytes in position["modules"].items():
        term = module_term(name)
        by_term.setdefault(term, []).append(name)
        dry_modules[term] = dry_modules.get(term, 0) + nbytes
    dry = {
        "parameters": position["param_bytes"],
        "gradients": position["grad_bytes"],
        "optimizer": position["optim_bytes"],
        **{t: dry_modules.get(t, 0) for t in MODULE_TERMS},
        "saved": position["activation_bytes"],
        "peak": position["peak_bytes"],
    }
    if dry_modules.get("other"):
        dry["other"] = dry_modules["other"]
    rows = []
    for term, measured in dry.items():
        planned = ours.get(term, 0.0)
        ratio = measured / planned if planned else None
        flagged = (ratio is None and measured > 0) or (ratio is not None and abs(ratio - 1) > FLAG)
        if term in MODULE_TERMS or term == "other":
            source = ", ".join(sorted(by_term.get(term, []))) or "(none on this rank)"
        elif term == "saved":
            source = "tensors saved for backward over the step's micro-batches (the census)"
        elif term == "peak":
            source = "the most bytes alive at once in the step (the step tracker)"
        else:
            source = f"{term} on the rank (the census)"
        rows.append(
            {
                "term": term,
                "dry_run_bytes": float(measured),
                "planner_bytes": float(planned),
                "paper_bytes": float(paper.get(term, 0.0)),
                "ratio": ratio,
                "flagged": bool(flagged),
                "source": source,
                "why": "; ".join(WHY[k] for k in _paper_why(term, model, layout, stage)),
            }
        )
    return rows
