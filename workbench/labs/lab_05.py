"""Checks of lab 05 (precision and recomputation), against the planner's activation formula."""

from __future__ import annotations

from .checking import checker
from .hints import fail_if, mismatch


@checker("lab_05.full_over_none")
def full_over_none(value, *, heads: int, seq_len: int, hidden: int, formula: dict) -> str:
    """Full recomputation keeps what fraction of the activation bytes of no recomputation (planner formula)?"""
    want = formula["full"] / formula["none"]
    block = 2 / want  # the block's count in s*b*h (full keeps 2sbh)
    eager = 2 / (block + 5 * heads * seq_len / hidden)
    fail_if(
        mismatch(
            value,
            want,
            what="full / none",
            rtol=1e-3,
            mistakes=[
                (
                    1 / want / want,
                    f"inverted: full recomputation keeps LESS, so the ratio is below 1 (2sbh over {block:g}sbh)",
                ),
                (2 / 34 / want, f"34sbh is the paper's GPT; this block keeps {block:g}sbh (count its tensors)"),
                (
                    eager / want,
                    "you kept the 5as/h score-matrix term; the planner's default attention='flash' never "
                    f"stores the scores, so none is {block:g}sbh",
                ),
                ((1 - want) / want, "that is the saving (1 - ratio); the question asks for the fraction kept"),
            ],
        )
    )
    return f"full recomputation keeps {want:.4f} of none's activation bytes (2sbh / {block:g}sbh)"
