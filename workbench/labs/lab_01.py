"""Checks of lab 01 (data parallelism), against what the ranks measured."""

from __future__ import annotations

from .checking import checker
from .hints import fail_if, mismatch, number


@checker("lab_01.local_batch")
def local_batch(value, *, local_batches: list[int], global_batch: int) -> str:
    """How many examples of the global batch does each rank get?"""
    n = len(local_batches)
    want = local_batches[0]
    fail_if(
        mismatch(
            value,
            want,
            what="the local batch",
            world_size=n,
            rtol=1e-9,
            mistakes=[
                (
                    global_batch / want,
                    f"{number(value)} is the whole global batch; data parallelism gives each of "
                    f"the {n} ranks 1/{n} of it",
                )
            ],
        )
    )
    return f"each of the {n} ranks takes {want} of the {global_batch} examples"


@checker("lab_01.grad_bytes")
def grad_bytes(value, *, all_reduced_bytes: int, n_params: int, world_size: int) -> str:
    """How many bytes of gradient does each rank all-reduce per step?"""
    fail_if(
        mismatch(
            value,
            all_reduced_bytes,
            what="the all-reduced bytes",
            world_size=world_size,
            rtol=1e-9,
            mistakes=[
                (
                    n_params / all_reduced_bytes,
                    "that is the number of parameters (elements); the gradients are fp32, 4 bytes each",
                ),
                (
                    2 * n_params / all_reduced_bytes,
                    "that counts 2 bytes per gradient (bf16); these gradients are fp32, 4 bytes each",
                ),
            ],
        )
    )
    return f"{number(all_reduced_bytes)} bytes each way: every fp32 gradient, whatever the bucketing"


@checker("lab_01.ring_bytes_sent")
def ring_bytes_sent(value, *, world_size: int, buffer_bytes: int) -> str:
    """How many bytes does each rank send in a ring all-reduce of the gradients?"""
    from workbench.planner import ring_bytes

    n, B = world_size, buffer_bytes
    want = ring_bytes("all_reduce", n, B)
    fail_if(
        mismatch(
            value,
            want,
            what="bytes sent per rank",
            rtol=1e-9,
            mistakes=[
                (2 * B / want, f"2B is the limit for many ranks; with n = {n} ranks it is 2(n-1)/n x B"),
                (
                    B / n / want,
                    "B/n is one chunk; a ring all-reduce sends n-1 chunks in reduce-scatter "
                    "and n-1 again in all-gather: 2(n-1)/n x B",
                ),
                ((n - 1) / n * B / want, "that is only the reduce-scatter half; the all-gather sends as much again"),
                (B / 4 / want, "that counts elements; B is in bytes (fp32: 4 bytes per gradient)"),
            ],
        )
    )
    return f"each rank sends {want:,.0f} bytes per step (2(n-1)/n x B with n = {n})"
