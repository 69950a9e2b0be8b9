"""``parallelize``: apply the degrees of a resolved spec to one rank's model, in a fixed order.

The order is torchtitan's ``parallelize_llama``, each step a small ``apply_*`` of its own:
pipeline split, fp8, tensor parallel, context and expert parallel, activation checkpointing,
compile, then data parallel last, so that FSDP shards the TP-sharded DTensors again (2-D).
:func:`check_layout` runs every check that depends on the model before any rank changes."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch import nn

from .base import (
    TORCH_DTYPES,
    Context,
    ModelHints,
    Prepared,
    PrepareError,
    build_optimizer,
    check_optimizer_matches,
    move_to,
    register,
)
from .blocks import Blocks, apply_activation_checkpointing, apply_compile, find_blocks
from .context_parallel import CPPrepared, apply_cp, check_cp_model, guard_direct_calls, recompute_context
from .ddp import apply_ddp
from .expert_parallel import apply_ep, check_ep_model, shard_experts
from .float8 import apply_fp8, check_fp8, mark_fp8_layout
from .fsdp2 import FSDP2Prepared, apply_fsdp, broadcast_from_rank0
from .layout import describe_params, make_layout
from .meshes import dp_coords, make_mesh
from .pipeline import PipelinePrepared, check_splittable, keep_stage, make_schedule, stage_blocks
from .spec import PRESET_DIMS, StrategySpec
from .tensor_parallel import apply_tp, keep_grad_placements, resolve_tp_plan

__all__ = ["parallelize", "check_layout", "LayoutCheck", "NATIVE_KINDS"]

NATIVE_KINDS = ("ddp", "fsdp2", "tp", "pp", "fsdp2_tp")


@dataclass(frozen=True)
class LayoutCheck:
    """What :func:`check_layout` found: the blocks (``None`` where none are needed and none
    were found) and, for ``pp``, the block keys of each stage."""

    blocks: Blocks | None
    stages: tuple[tuple[str, ...], ...] | None
    fp8_linears: tuple[str, ...] = ()  # the block linears fp8 converts (empty: fp8 off)


def _uses_fsdp(s: StrategySpec, world: int) -> bool:
    d = s.dims(world)
    return d.fsdp_enabled or s.kind in ("fsdp2", "fsdp2_tp")


def check_layout(
    model: nn.Module,
    s: StrategySpec,
    world: int,
    hints: ModelHints = ModelHints(),  # noqa: B008 (frozen)
    device=None,
) -> LayoutCheck:
    """Every model-dependent check, pure (no communication): raise :class:`PrepareError`
    with one message, leaving the model as it was. ``device``: the rank's (fp8 asks its SM)."""
    d = s.dims(world)
    stages = None
    if s.kind == "pp" or d.pp_enabled:
        stages = tuple(tuple(k) for k in check_splittable(model, d.pp, hints.pp_boundaries))
    elif hints.pp_boundaries is not None:
        raise PrepareError(f"pp_boundaries={list(hints.pp_boundaries)} given but pp=1; add pp=N or drop pp_boundaries")
    plan = None
    if d.tp_enabled or s.kind in ("tp", "fsdp2_tp"):
        plan = resolve_tp_plan(model, d.tp, tp_plan=hints.tp_plan, sequence_parallel=s.sequence_parallel)
    elif hints.tp_plan is not None:
        raise PrepareError("tp_plan= given but tp=1; add tp=N (e.g. 'fsdp2 tp=2') or drop tp_plan")
    if d.cp_enabled:
        check_cp_model(model, d.cp)
    if d.ep_enabled:
        check_ep_model(model, d.ep)
    needed = _uses_fsdp(s, world) or s.activation_checkpointing != "none" or s.compile or s.cuda_graphs
    needed = needed or s.fp8 != "none"
    if needed or hints.blocks is not None:
        purpose = "FSDP2 wrapping" if _uses_fsdp(s, world) else "activation checkpointing / compile / fp8"
        blocks = find_blocks(model, hints.blocks, purpose=purpose)
    else:
        try:
            blocks = find_blocks(model)
        except PrepareError:
            blocks = None  # DDP / TP alone do not need blocks
    fp8 = ()
    if s.fp8 != "none":
        import torch

        dev = device if device is not None else torch.device("cpu")
        fp8 = tuple(check_fp8(model, s, blocks, d.tp, plan.entries if plan else None, dev))
    return LayoutCheck(blocks, stages, fp8)


def apply_pipeline(model, mesh, check: LayoutCheck, ctx: Context) -> tuple[int, Blocks]:
    stage_idx = mesh.get_local_rank("pp")
    n = mesh.size(mesh.mesh_dim_names.index("pp"))
    owned = list(check.stages[stage_idx])
    keep_stage(model, stage_idx, owned, last=stage_idx == n - 1)
    names, mods = stage_blocks(model)
    ctx.notes.append(
        f"pipeline stage {stage_idx}/{n} owns blocks {owned}"
        + (" + embedding" if stage_idx == 0 else "")
        + (" + norm/output" if stage_idx == n - 1 else "")
        + f"; schedule {ctx.spec.pp_schedule}, {ctx.spec.microbatches} microbatches"
    )
    return stage_idx, Blocks(tuple(names), tuple(mods), "pipeline stage", None)


DP_DIMS = ("dp_replicate", "dp_shard", "dp_shard_mod_ep", "ep", "cp")
EP_FLAT = {"dp_shard": ("dp_shard_mod_ep", "ep")}  # ep borrows dp_shard: its flattened dim


def _dp_group(mesh, names):
    """The group the reported loss is averaged over: every rank that sees different tokens."""
    dp = tuple(n for n in DP_DIMS if n in names)
    if not dp:
        return None
    if len(dp) == 1:
        return mesh.get_group(dp[0])
    return mesh[dp]._flatten("_".join(dp) + "_loss").get_group()


def _fsdp_mesh(mesh, names):
    """FSDP2's mesh: ``dp_shard`` (x ``cp`` flattened in, which shares the weights), with
    ``dp_replicate`` in front for HSDP. With ``ep``: ``dp_shard_mod_ep x ep`` flattened."""
    if "ep" in names:
        return mesh[("dp_shard_mod_ep", "ep")]._flatten("dp_shard")
    shard = tuple(n for n in ("dp_shard", "cp") if n in names) or ("dp_shard",)
    if len(shard) > 1:
        flat = mesh[shard]._flatten("dp_shard_cp")
        if "dp_replicate" not in names:
            return flat
        shard = ("dp_shard_cp",)
    dims = (("dp_replicate",) if "dp_replicate" in names else ()) + shard
    return mesh[dims] if len(dims) > 1 else mesh[dims[0]]


def _params(model, names, stage_idx) -> list[dict]:
    if stage_idx is None:
        by_name = "cp" in names or "ep" in names
        return describe_params(model, len(names), dim_names=tuple(names) if by_name else None, flattened=EP_FLAT)
    rest = len(names) - 1
    entries = describe_params(model, rest)
    for e in entries:
        e["placements"] = [f"Stage({stage_idx})"] + (e["placements"] if rest else [])
    return entries


def parallelize(model: nn.Module, optimizer, ctx: Context) -> Prepared:
    """Apply ``ctx.spec``'s degrees to ``model`` in the module's order; build the optimizer.

    Data parallel comes last: FSDP2 over ``dp_shard`` (x ``cp`` when on; experts over
    ``dp_shard_mod_ep``), HSDP over ``dp_replicate x dp_shard``, per block and root, or DDP
    over ``dp_replicate`` alone; activation checkpointing and compile wrap the block forwards
    that FSDP's per-block hooks then surround. fp8 swaps the block linears before TP and FSDP
    shard them."""
    s = ctx.spec
    d = s.dims(ctx.world_size)
    check = check_layout(model, s, ctx.world_size, ctx.hints)
    shape, names = d.mesh_dims(PRESET_DIMS[s.kind])
    mesh = make_mesh(ctx.mesh_device, shape, names)
    ctx.notes.append(
        f"degrees {d.describe()}; order: pipeline, tp, cp, activation checkpointing, compile, data parallel"
    )
    broadcast_from_rank0(model)
    total_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    blocks = check.blocks
    stage_idx = None
    if "pp" in names:  # 1. pipeline split
        stage_idx, blocks = apply_pipeline(model, mesh, check, ctx)
    if check.fp8_linears:  # 1b. fp8, before TP and FSDP see the linears
        apply_fp8(model, s, list(check.fp8_linears), _uses_fsdp(s, ctx.world_size), ctx.notes)
    if "tp" in names:  # 2. tensor parallel
        plan = resolve_tp_plan(
            model, d.tp, tp_plan=ctx.hints.tp_plan, sequence_parallel=s.sequence_parallel, stage=stage_idx is not None
        )
        apply_tp(model, mesh["tp"], plan, ctx.notes)
    cp_state = None
    if "cp" in names:  # 3. context parallel
        cp_kind = check_cp_model(model, d.cp)
        cp_state = apply_cp(model, cp_kind, mesh.get_group("cp"), ctx.notes)
    if "ep" in names:  # 3b. expert parallel
        apply_ep(model, mesh, ctx.notes)
    if blocks is not None:  # 4./5. per block
        ctx.notes.append(f"blocks: {blocks.describe()}")
        recompute = recompute_context(cp_state) if cp_state is not None else None
        apply_activation_checkpointing(blocks, s.activation_checkpointing, ctx.notes, recompute)
        if s.compile or s.cuda_graphs:
            apply_compile(blocks, ctx.notes, mode="reduce-overhead" if s.cuda_graphs else None)
    wrapped, prepared_cls = model, Prepared
    if _uses_fsdp(s, ctx.world_size):  # 6. data parallel
        fsdp_mesh = _fsdp_mesh(mesh, names)
        if "ep" in names:
            shard_experts(model, mesh, fsdp_mesh, s, d.dp_shard, ctx.notes)
        apply_fsdp(model, list(blocks.modules), fsdp_mesh, s, ctx.notes)
        prepared_cls = FSDP2Prepared
    elif "dp_replicate" in names:
        wrapped = apply_ddp(model, ctx, mesh.get_group("dp_replicate"))
    if stage_idx is not None:
        move_to(model, ctx.device)
        schedule = make_schedule(model, stage_idx, d.pp, ctx.device, mesh.get_group("pp"), s, ctx.loss_fn)
    if "tp" in names and prepared_cls is not FSDP2Prepared:  # after model.to(), which drops tensor hooks
        keep_grad_placements(model, ctx.notes)
    opt = build_optimizer(wrapped, optimizer, ctx.notes)
    check_optimizer_matches(model, opt, where=f"rank {ctx.rank}: ")
    dp_rank, dp_size = dp_coords(mesh, ("dp_replicate", "dp_shard", "dp_shard_mod_ep", "ep"))
    layout = make_layout(
        strategy=s.kind,
        path="native",
        mesh_shape=mesh.shape,
        dim_names=names,
        rank=ctx.rank,
        world_size=ctx.world_size,
        params=_params(model, names, stage_idx),
        notes=ctx.notes,
        dp_rank=dp_rank,
        dp_size=dp_size,
        param_bytes_global=total_bytes if stage_idx is not None else None,
    )
    layout["degrees"] = d.as_dict()
    layout["blocks"] = list(blocks.names) if blocks is not None else []
    if check.fp8_linears:
        mark_fp8_layout(layout, model, s)
    autocast = None if s.param_dtype == "fp32" or prepared_cls is FSDP2Prepared else TORCH_DTYPES[s.param_dtype]
    common = dict(
        model=wrapped,
        optimizer=opt,
        layout=layout,
        spec=s,
        ctx=ctx,
        mesh=mesh,
        loss_group=_dp_group(mesh, names),
        dp_rank=dp_rank,
        dp_size=dp_size,
        inner=model,
        autocast_dtype=autocast,
    )
    if stage_idx is not None:
        pp_group = mesh.get_group("pp")
        last_rank = dist.get_global_rank(pp_group, d.pp - 1) if d.pp > 1 else ctx.rank
        return PipelinePrepared(
            schedule=schedule,
            stage_idx=stage_idx,
            n_stages=d.pp,
            pp_group=pp_group,
            last_rank=last_rank,
            sharded=prepared_cls is FSDP2Prepared,
            **common,
        )
    if cp_state is not None:
        guard_direct_calls(model, cp_state)
        return CPPrepared(cp_state=cp_state, cp_kind=cp_kind, **common)
    return prepared_cls(**common)


class NativeStrategy:
    """Every degree-based preset runs through :func:`parallelize`."""

    kind = "native"

    def apply(self, model, optimizer, ctx: Context) -> Prepared:
        return parallelize(model, optimizer, ctx)


for _kind in NATIVE_KINDS:
    register(type(f"Native_{_kind}", (NativeStrategy,), {"kind": _kind}))
