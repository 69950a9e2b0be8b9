"""The planner's parameter bytes per rank beside what ranks report holding.

The planner's FSDP/TP arithmetic (:func:`workbench.planner.memory.model_state_bytes`) says
what one rank holds of a model's parameters; a layout description (a torch model's, or a
JAX rank's from ``engine.describe_jax``) says what each rank really holds. This puts the
two side by side, rank by rank, so that a sharding in either framework is checked against
the same arithmetic.
"""

from __future__ import annotations

from dataclasses import asdict

from .layout import PlanLayout
from .memory import model_state_bytes
from .model_spec import ModelSpec


def predicted_param_bytes(model: ModelSpec, layout: PlanLayout) -> float:
    """Parameter bytes on one rank by the planner's arithmetic (no pipeline split)."""
    if layout.pp != 1:
        raise ValueError(f"predicted_param_bytes compares layouts without pipeline stages; got pp={layout.pp}")
    return model_state_bytes(model, layout, 0)[0]


def compare_param_bytes(layouts: list[dict], model: ModelSpec, layout: PlanLayout) -> list[dict]:
    """One row per rank: bytes held (``param_bytes_local``), the planner's, their ratio."""
    if layout.world_size != len(layouts):
        raise ValueError(
            f"the plan is for {layout.world_size} ranks and the layout came from {len(layouts)}: "
            "give a PlanLayout whose degrees multiply to the rank count"
        )
    predicted = predicted_param_bytes(model, layout)
    return [
        {
            "rank": lay["rank"],
            "measured_bytes": int(lay["param_bytes_local"]),
            "predicted_bytes": predicted,
            "ratio": lay["param_bytes_local"] / predicted,
        }
        for lay in sorted(layouts, key=lambda lay: lay["rank"])
    ]


def shape_config(model: ModelSpec) -> dict:
    """The shape fields a rank needs to build the same model (``engine.jax_models.llama_params``)."""
    if model.is_moe or model.tied_embeddings:
        raise ValueError(
            f"{model.name}: the JAX model is dense with an untied head; give a ModelSpec with experts=1 "
            "and tied_embeddings=False"
        )
    d = asdict(model)
    return {k: d[k] for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")}
