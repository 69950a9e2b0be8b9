"""``prepare(model, optimizer, spec)``: validate, then apply one strategy on this rank.

Order of work: (1) parse and validate the spec against the world size, model config and
device — nothing has touched the model or the process group yet, so a bad spec leaves the
ranks exactly as they were; (2) reset Accelerate's process-wide state; (3) move the model
to the device and hand it to the registered strategy (or the Accelerate path on CUDA).
"""

from __future__ import annotations

import torch
from torch import nn

from . import ddp, parallelize, zero  # noqa: F401  (registration)
from .accelerate_path import accelerate_prepare, choose_path, reset_accelerate_state
from .base import Context, ModelHints, Prepared, PrepareError, get_strategy, lm_loss, move_to
from .meshes import layout_scope
from .parallelize import check_layout
from .spec import SpecError, StrategySpec

__all__ = ["prepare", "model_config_of"]


def _world() -> tuple[int, int, bool]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), True
    return 0, 1, False


def model_config_of(model: nn.Module):
    """The config ``validate`` checks against: an MoE config, a GPT config, or ``None``."""
    return getattr(model, "moe_cfg", None) or getattr(model, "cfg", None)


def mesh_device_for(pg_backend: str | None) -> str:
    """The mesh device when the caller names none: what the process group carries. The
    workbench runtime puts a rank on NCCL exactly when it pinned a GPU (``engine.device``
    is CUDA), and NCCL carries CUDA tensors only; gloo and no group mean CPU."""
    return "cuda" if pg_backend == "nccl" else "cpu"


def _default_mesh_device() -> str:
    import torch.distributed as dist

    return mesh_device_for(dist.get_backend() if dist.is_available() and dist.is_initialized() else None)


def prepare(
    model: nn.Module,
    optimizer,
    spec: StrategySpec | str,
    *,
    mesh_device: str | None = None,
    loss_fn=lm_loss,
    blocks=None,
    tp_plan: dict | None = None,
    pp_boundaries=None,
) -> Prepared:
    """Shard ``model`` on this rank according to ``spec`` and build its optimizer.

    ``optimizer`` is preferably a factory ``lambda params: torch.optim.AdamW(params, lr=...)``,
    called AFTER sharding; an un-stepped optimizer instance is rebuilt from its class and
    defaults. Call on every rank, with identically initialised models (rank 0's weights
    are broadcast where a strategy shards). Returns :class:`Prepared`. ``mesh_device``
    defaults to the rank's device (CUDA on NCCL ranks), see :func:`mesh_device_for`.

    ``blocks``: the model's blocks (class names, module paths/globs, or a predicate), found
    automatically otherwise (see :mod:`workbench.strategies.blocks`). ``tp_plan``: module
    patterns -> "colwise"/"rowwise"/... for a model without its own plan. ``pp_boundaries``:
    block indices where pipeline stages 1.. start (even split otherwise).
    """
    if isinstance(spec, str):
        spec = StrategySpec.parse(spec)
    if mesh_device is None:
        mesh_device = _default_mesh_device()
    rank, world, has_pg = _world()
    resolved = spec.validate(world, model_config_of(model), device_type=mesh_device)
    if mesh_device == "cuda" and not torch.cuda.is_available():
        raise SpecError("mesh_device='cuda' but CUDA is not available on this rank; use mesh_device='cpu'")
    if not has_pg and spec.kind != "none":
        raise PrepareError(
            f"kind={spec.kind!r} needs the default process group; start ranks with "
            "'%distrain start' (or torch.distributed.init_process_group) first"
        )
    if getattr(model, "_workbench_prepared", None):
        raise PrepareError(
            f"this model was already prepared with {model._workbench_prepared!r}; its "
            "parameters are changed in place. Build a fresh model (same seed) for a new strategy."
        )
    hints = ModelHints(
        blocks=blocks, tp_plan=tp_plan, pp_boundaries=tuple(pp_boundaries) if pp_boundaries is not None else None
    )
    if resolved.kind in ("none", "zero"):
        if tp_plan is not None or pp_boundaries is not None:
            raise PrepareError(
                f"tp_plan / pp_boundaries given, but kind={resolved.kind!r} has no tp or pp; "
                "use e.g. 'fsdp2 tp=2' or 'pp=2 dp_shard=2', or drop them"
            )
    device = torch.device("cuda", torch.cuda.current_device()) if mesh_device == "cuda" else torch.device("cpu")
    if resolved.kind not in ("none", "zero") or resolved.fp8 != "none" or resolved.cuda_graphs:
        check_layout(model, resolved, world, hints, device)  # model checks, still before anything changes
    reset_accelerate_state()
    move_to(model, device)
    path, reason = choose_path(resolved, mesh_device)
    ctx = Context(
        spec=resolved,
        rank=rank,
        world_size=world,
        device=device,
        mesh_device=mesh_device,
        loss_fn=loss_fn,
        notes=[f"path {path}: {reason}"],
        hints=hints,
    )
    with layout_scope(("prepare", path, resolved.kind, mesh_device)) as scope:
        if path == "accelerate":
            prepared = accelerate_prepare(model, optimizer, ctx)
        else:
            prepared = get_strategy(resolved.kind).apply(model, optimizer, ctx)
        scope["prepared"] = prepared
    object.__setattr__(model, "_workbench_prepared", resolved.kind)
    return prepared
