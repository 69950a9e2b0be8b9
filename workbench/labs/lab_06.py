"""Checks of lab 06 (mixture of experts), against the router statistics the ranks measured."""

from __future__ import annotations

import math

from .checking import checker
from .hints import fail_if, mismatch


@checker("lab_06.capacity")
def capacity(
    value, *, measured: int, capacity_factor: float, tokens: int, top_k: int, experts: int, world_size: int
) -> str:
    """Expert capacity C: how many token slots does each expert get?"""
    cf, T, k, E = capacity_factor, tokens, top_k, experts
    fail_if(
        mismatch(
            value,
            measured,
            what="the capacity",
            rtol=1e-9,
            mistakes=[
                (cf * T / E / measured, f"each token takes top_k = {k} slots: C = ceil(cf x T x k / E)"),
                (T * k / E / measured, f"you left out the capacity factor cf = {cf}"),
                (cf * T * k / measured, f"that is every slot of every expert; divide by the E = {E} experts"),
                (cf * T * k / world_size / measured, f"divide by the E = {E} experts, not by the {world_size} ranks"),
                (math.floor(cf * T * k / E) / measured, "round up (ceil), not down"),
            ],
        )
    )
    return f"capacity {int(measured)} = ceil({cf} x {T} x {k} / {E})"
