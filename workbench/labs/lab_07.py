"""Checks of lab 07 (planning 70B on paper), against the planner."""

from __future__ import annotations

from .checking import CheckFailed, checker
from .hints import fail_if, mismatch

GB = 1e9


@checker("lab_07.ddp_gb")
def ddp_gb(value, *, states_bytes: float) -> str:
    """How many GB of model states does each GPU hold under plain DDP?"""
    want = states_bytes / GB
    fail_if(
        mismatch(
            value,
            want,
            what="DDP GB per GPU",
            rtol=1e-3,
            mistakes=[
                (want / 16 / want, "that is the parameter count in billions; count 16 bytes per parameter"),
                (2 / 16, "that is only the bf16 weights (2 bytes); Adam mixed precision holds 16 bytes per parameter"),
                (1024**3 / GB, "GiB vs GB: the labs use GB = 1e9 bytes"),
                (GB / 1024**3, "GiB vs GB: the labs use GB = 1e9 bytes"),
            ],
        )
    )
    return f"DDP holds {want:,.1f} GB per GPU"


@checker("lab_07.fits_on_h100")
def fits_on_h100(value, *, gb: float, memory_gb: float) -> str:
    """Does the DDP copy fit on one 80 GB H100 (True/False)?"""
    want = gb <= memory_gb
    if not isinstance(value, bool):
        raise CheckFailed(f"answer True or False, got {value!r}")
    if value != want:
        raise CheckFailed(
            f"{gb:,.0f} GB against {memory_gb:,.0f} GB of HBM: compare the two; "
            f"{'it does not fit' if not want else 'it fits'}"
        )
    return (
        "right: DDP alone cannot train 70B on any single accelerator in the catalogue"
        if not want
        else f"{gb:,.0f} GB fits in {memory_gb:,.0f} GB"
    )


@checker("lab_07.zero3_gb")
def zero3_gb(value, *, planner_bytes: float, ranks: int) -> str:
    """ZeRO-3 over 256 ranks: model states per GPU, in GB?"""
    want = planner_bytes / GB
    fail_if(
        mismatch(
            value,
            want,
            what="ZeRO-3 GB per GPU",
            world_size=ranks,
            rtol=1e-3,
            mistakes=[
                (12 / 16, "that shards only the 12 optimizer bytes (ZeRO-1); ZeRO-3 shards all 16"),
                (1e3, "that is MB, not GB"),
            ],
        )
    )
    return f"ZeRO-3 model states per GPU: {want:.2f} GB"


@checker("lab_07.selective_bytes")
def selective_bytes(value, *, planner_bytes: float, tp: int, heads: int, seq_len: int, hidden: int) -> str:
    """Selective-recompute activation bytes per layer with sequence parallelism, by hand?"""
    want = planner_bytes
    block = planner_bytes / (seq_len * hidden / tp)  # the block's count in s*b*h/t (b = 1)
    fail_if(
        mismatch(
            value,
            want,
            what="bytes per layer",
            world_size=tp,
            rtol=1e-9,
            mistakes=[
                (
                    (34 + 5 * heads * seq_len / hidden) / block,
                    f"selective recomputation drops the 5as/h score term: {block:g}sbh/t",
                ),
                (34 / block, f"34 is the paper's GPT; this block keeps {block:g}sbh (count its tensors)"),
                (1 / 2, f"the {block:g} already counts 16-bit bytes; do not divide by 2"),
                (2, f"the {block:g} already counts 16-bit bytes; do not multiply by 2"),
            ],
        )
    )
    return f"{want / 1e6:.1f} MB per layer ({block:g}sbh/t)"


@checker("lab_07.ddp_send_gb")
def ddp_send_gb(value, *, ranks: int, grad_bytes: float) -> str:
    """DDP over 8 GPUs, 1B bf16 gradients: GB sent per GPU per step?"""
    from workbench.planner import ring_bytes

    n = ranks
    want = ring_bytes("all_reduce", n, grad_bytes) / GB
    fail_if(
        mismatch(
            value,
            want,
            what="GB sent per GPU",
            rtol=1e-9,
            mistakes=[
                (2 * grad_bytes / GB / want, f"2B is the many-ranks limit; with n = {n} it is 2(n-1)/n x B"),
                (grad_bytes / GB / want, "B is what each GPU holds; a ring all-reduce sends 2(n-1)/n x B"),
                (2, "bf16 gradients are 2 bytes each, not 4"),
                (1 / 2, "bf16 gradients are 2 bytes each: B = 2 bytes x 1e9 parameters"),
            ],
        )
    )
    return f"{want:.2f} GB per GPU per step"
