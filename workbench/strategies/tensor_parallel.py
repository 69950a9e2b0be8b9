"""Tensor parallel (Megatron-LM, Shoeybi et al. 2019) with DTensor's ``parallelize_module``.

Column-parallel q/k/v and w1/w3 split heads and hidden units over ranks; row-parallel wo
and w2 sum the partial outputs (one all-reduce per attention and per MLP). With
sequence parallel (Korthikanti et al. 2022) the norms and residual stream are split along
the sequence and the all-reduce becomes a reduce-scatter + all-gather pair.

Naive form, for teaching (one MLP)::

    h_local = silu(x @ W1[:, mine]) * (x @ W3[:, mine])   # column split: no comm
    y = all_reduce(h_local @ W2[mine, :])                 # row split: one all-reduce
"""
from __future__ import annotations

from torch import nn

from .base import TORCH_DTYPES, Context, Prepared, PrepareError, apply_activation_checkpointing, apply_compile, build_optimizer, check_optimizer_matches, register
from .layout import describe_params, make_layout
from .meshes import make_mesh

__all__ = ["TPStrategy", "apply_tp"]


def apply_tp(model: nn.Module, tp_mesh, sequence_parallel: bool, notes: list[str]) -> nn.Module:
    from torch.distributed.tensor.parallel import parallelize_module

    plan_fn = getattr(model, "tp_plan", None)
    if plan_fn is None:
        raise PrepareError(f"{type(model).__name__} has no tp_plan(); tensor parallel needs one (see workbench.models.GPT.tp_plan)")
    plan = plan_fn(sequence_parallel=sequence_parallel)
    parallelize_module(model, tp_mesh, plan)
    notes.append(f"tensor parallel over {tp_mesh.size()} rank(s): {len(plan)} plan entries, "
                 f"sequence_parallel={sequence_parallel}")
    return model


@register
class TPStrategy:
    kind = "tp"

    def apply(self, model, optimizer, ctx: Context) -> Prepared:
        s = ctx.spec
        mesh = make_mesh(ctx, (s.tp,), ("tp",))
        apply_tp(model, mesh, s.sequence_parallel, ctx.notes)
        apply_activation_checkpointing(model, s.activation_checkpointing, ctx.notes)
        if s.compile:
            apply_compile(model, ctx.notes)
        opt = build_optimizer(model, optimizer, ctx.notes)
        check_optimizer_matches(model, opt, where=f"rank {ctx.rank}: ")
        layout = make_layout(strategy=self.kind, path="native", mesh_shape=mesh.shape, dim_names=("tp",),
                             rank=ctx.rank, world_size=ctx.world_size, params=describe_params(model, 1),
                             notes=ctx.notes, dp_rank=0, dp_size=1)
        return Prepared(model=model, optimizer=opt, layout=layout, spec=s, ctx=ctx, mesh=mesh,
                        loss_group=None, dp_rank=0, dp_size=1, inner=model,
                        autocast_dtype=None if s.param_dtype == "fp32" else TORCH_DTYPES[s.param_dtype])
