"""``%distrain plan --live``: the planner's prediction for the ranks' model against one
measured training step (the census runs on the ranks, :class:`workbench.engine.rpc.Census`;
the arithmetic is the pure :mod:`workbench.planner.live`)."""

from __future__ import annotations

from ..engine import rpc
from ..planner.live import TOLERANCE, compare, layout_from_spec, model_spec_from_config
from . import api


def plan_live(*, batch_size: int = 8, hardware: str = "h100", show: bool = True):
    """Plan the ranks' model under its current strategy, print the plan, and return the
    "predicted vs measured" DataFrame (one row per rank and part).

    The ranks run ONE real training step (a global batch of ``batch_size`` sequences of
    the bundled text) to measure gradients, optimizer state and activations.
    """
    from ..planner.report import plan

    censuses = [r.record() for r in api.current().apply(rpc.handle, rpc.Census(batch_size=batch_size))]
    if not censuses or not censuses[0]["model_config"]:
        raise ValueError("the ranks' model carries no GPTConfig/MoEConfig (model.cfg); the planner needs its shape")
    c0 = censuses[0]
    model = model_spec_from_config(c0["model_config"], seq_len=c0["batch_shape"][1])
    attention = c0.get("attention") or "flash"
    layout = layout_from_spec(c0["spec"], c0["world_size"], micro_batch_size=c0["batch_shape"][0], attention=attention)
    table = compare(censuses)
    if show:
        print(
            f"attention kernel on the ranks: {attention} ({c0.get('attention_evidence', 'not measured')})"
            + ("" if c0.get("attention") else "; none seen, planned as flash")
        )
        print(plan(model, layout, hardware).summary())
        off = table[table["ratio"].notna() & ((table["ratio"] - 1).abs() > TOLERANCE)]
        print(
            f"measured on the ranks: one training step ({c0['strategy']} via {c0['path']}, local batch "
            f"{c0['batch_shape']}); predicted vs measured per rank is the returned table "
            f"({len(off)} of {len(table)} rows differ by more than {TOLERANCE:.0%}, each with an explanation; "
            "workbench.planner.live.format_table(df) prints it, "
            "workbench.notebook.dashboard.plan_figure.predicted_vs_measured_figure(df) draws it)"
        )
    return table
