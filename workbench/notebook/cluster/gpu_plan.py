"""Which backend and GPUs a rank set on this host gets (notebook side, no torch).

NCCL needs one GPU per rank: two ranks on one GPU fail inside the first collective,
long after start-up. Deciding here, from the visible GPU count alone, lets the
refusal come before any process is started.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuPlan:
    backend: str  # "nccl" or "gloo": what the ranks will initialise
    gpu_ids: tuple[int, ...]  # GPUs to pin, rank on this host i -> gpu_ids[i]; empty for CPU ranks


def plan_gpus(backend: str, n: int, visible: list[int]) -> GpuPlan:
    """The plan for ``n`` ranks on one host seeing GPUs ``visible`` (CUDA_VISIBLE_DEVICES order).

    ``auto`` is NCCL with one GPU per rank when there are at least ``n`` GPUs, gloo when
    there are none; with some but too few it refuses (``--backend gloo`` is the explicit
    opt-in to CPU ranks on a GPU host).
    """
    if backend == "gloo":
        return GpuPlan("gloo", ())
    if not visible:
        if backend == "nccl":
            raise ValueError("--backend nccl needs GPUs and none are visible: use --backend gloo (CPU ranks)")
        return GpuPlan("gloo", ())
    if len(visible) < n:
        gpus = f"{len(visible)} GPU{'s' if len(visible) != 1 else ''}"
        raise ValueError(
            f"{n} ranks but {gpus} visible (NCCL needs one GPU per rank): use -n {len(visible)}, "
            f"or --backend gloo for CPU ranks"
        )
    return GpuPlan("nccl", tuple(visible[:n]))
