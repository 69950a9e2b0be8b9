"""Checks of lab 04 (pipeline bubbles), against the ranks' stage setup and the planner."""

from __future__ import annotations

from .checking import checker
from .hints import fail_if, mismatch, number


@checker("lab_04.send_bytes")
def send_bytes(value, *, micro_batches: int, batch: int, width: int, element_size: int, world_size: int) -> str:
    """How many bytes does stage 0 send to stage 1 per micro-batch (forward activation)?"""
    m = micro_batches
    want = batch // m * width * element_size
    fail_if(
        mismatch(
            value,
            want,
            what="bytes per micro-batch",
            world_size=world_size,
            rtol=1e-9,
            mistakes=[
                (1 / element_size, f"that counts elements; each is {element_size} bytes (fp32)"),
                (m, f"that is the whole batch of {batch}; each of the m = {m} micro-batches carries {batch // m} rows"),
                (
                    m / element_size,
                    f"that is the whole batch, in elements: {batch} / m rows x {width} x {element_size} bytes",
                ),
            ],
        )
    )
    return f"{batch // m} rows x {width} x {element_size} bytes = {number(want)} bytes per micro-batch"


@checker("lab_04.bubble_of_step")
def bubble_of_step(value, *, stages: int, micro_batches: int, measured: float | None = None) -> str:
    """What fraction of a GPipe step is bubble, from the planner's (p-1)/m of the compute?"""
    from workbench.planner import bubble_fraction

    p, m = stages, micro_batches
    b = bubble_fraction(p, m)
    want = b / (1 + b)
    fail_if(
        mismatch(
            value,
            want,
            what="the bubble's fraction of the step",
            rtol=1e-6,
            mistakes=[
                (
                    b / want,
                    f"(p-1)/m = {b:.3f} is the bubble relative to the compute time; the step is compute + "
                    f"bubble, so its fraction of the step is b/(1+b) = (p-1)/(m+p-1)",
                ),
                ((1 - want) / want, "that is the busy fraction; the bubble is the idle part: 1 - busy"),
                ((p - 1) / p / want, f"that is the bubble at m = 1 ((p-1)/p); use m = {m}"),
            ],
        )
    )
    seen = f"; measured {measured:.2f}" if measured is not None else ""
    return f"the bubble is {want:.3f} of a GPipe step at p = {p}, m = {m}{seen}"
