"""Checks of lab 02 (ZeRO and FSDP2 memory), against the bytes the ranks counted."""

from __future__ import annotations

from .checking import checker
from .hints import fail_if, mismatch, number


@checker("lab_02.ddp_bytes_per_rank")
def ddp_bytes_per_rank(value, *, n_params: int, world_size: int) -> str:
    """How many bytes of parameters, gradients and AdamW state does each DDP rank hold (fp32)?"""
    want = 16 * n_params  # the ranks' parameter count x (4 param + 4 grad + 8 Adam), unsharded under DDP
    fail_if(
        mismatch(
            value,
            want,
            what="DDP bytes per rank",
            world_size=world_size,
            rtol=1e-9,
            mistakes=[
                (
                    1 / 16,
                    "that is the number of parameters; count bytes: 4 (param) + 4 (grad) + 8 (Adam) per parameter",
                ),
                (1 / 4, "that is only the fp32 parameters; gradients (4) and AdamW's two moments (8) live there too"),
                (8 / 16, "that leaves out AdamW's state: exp_avg and exp_avg_sq, 8 bytes per parameter"),
                (12 / 16, "that leaves out one of parameters/gradients (4 bytes each)"),
                (1 / world_size, f"DDP shards nothing: every rank holds all of it (you divided by {world_size})"),
            ],
        )
    )
    return f"DDP holds 16 bytes x {n_params:,} parameters = {number(want)} bytes on every rank"


@checker("lab_02.fsdp2_bytes_per_rank")
def fsdp2_bytes_per_rank(value, *, measured: int, n_params: int, world_size: int) -> str:
    """FSDP2's parameter + gradient + optimizer bytes per rank, worked out by hand."""
    n = world_size
    fail_if(
        mismatch(
            value,
            measured,
            what="FSDP2 bytes per rank",
            world_size=n,
            rtol=1e-9,
            mistakes=[
                (
                    16 * n_params / measured,
                    f"16 bytes x parameters is the unsharded (DDP) total; FSDP2 shards all of it over {n} ranks",
                ),
                (n_params / n / measured, "that counts parameters, not bytes: 16 bytes each (4 + 4 + 8)"),
                (12 * n_params / n / measured, "that leaves out 4 bytes per parameter (parameters or gradients)"),
                (8 * n_params / n / measured, "that leaves out AdamW's 8 bytes per parameter"),
            ],
        )
    )
    return f"FSDP2 holds 16 x {n_params:,} / {n} = {number(measured)} bytes per rank, as measured"
