"""Tensor parallel (Megatron-LM, Shoeybi et al. 2019) with DTensor's ``parallelize_module``.

Plans come from, in order: a user's ``tp_plan=`` dict, the model's own
``tp_plan(sequence_parallel)`` (the workbench GPT), or a Hugging Face model's ``tp_plan``;
patterns are expanded to module names and checked before any rank changes. What column and
row splits do, naively: docs/strategies.md."""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass
from math import gcd

from torch import nn

from .base import PrepareError

__all__ = ["TPPlan", "resolve_tp_plan", "apply_tp", "keep_grad_placements", "STYLES"]

# Style names as transformers writes them -> what they mean in torch's DTensor styles.
STYLES = {
    "colwise": "ColwiseParallel()",
    "rowwise": "RowwiseParallel()",
    "colwise_rep": "ColwiseParallel(output_layouts=Replicate())",
    "colwise_gather_output": "ColwiseParallel(output_layouts=Replicate())",
    "rowwise_rep": "RowwiseParallel(input_layouts=Replicate())",
    "embedding_rowwise": "RowwiseParallel(input_layouts=Replicate())",
    "sequence_parallel": "SequenceParallel()",
}


@dataclass(frozen=True)
class TPPlan:
    """A plan expanded to concrete module names, with where it came from."""

    entries: dict  # module name -> ParallelStyle
    source: str  # "tp_plan=", "model.tp_plan()", "transformers tp_plan"
    sequence_parallel: bool


def _style(name: str, raw):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

    if isinstance(raw, ParallelStyle):
        return raw
    key = str(raw).lower()
    if key in ("colwise",):
        return ColwiseParallel()
    if key == "rowwise":
        return RowwiseParallel()
    if key in ("colwise_rep", "colwise_gather_output"):
        return ColwiseParallel(output_layouts=Replicate())
    if key in ("rowwise_rep", "embedding_rowwise"):
        return RowwiseParallel(input_layouts=Replicate())
    if key == "sequence_parallel":
        return SequenceParallel()
    near = difflib.get_close_matches(key, list(STYLES), n=1)
    raise PrepareError(
        f"tensor-parallel style {raw!r} for {name!r} is not supported"
        f"{f' (did you mean {near[0]!r}?)' if near else ''}; use one of {sorted(STYLES)} "
        "or a torch.distributed.tensor.parallel ParallelStyle"
    )


def _expand(model: nn.Module, patterns: dict, source: str, missing_ok: bool = False) -> dict:
    """Pattern -> concrete module names (``*`` matches one path segment, as in transformers)."""
    names = [n for n, _ in model.named_modules() if n]
    out: dict = {}
    for pat, raw in patterns.items():
        parts = pat.split(".")
        hits = [
            n
            for n in names
            if len(n.split(".")) == len(parts) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(n.split("."), parts))
        ]
        if not hits and missing_ok:
            continue
        if not hits:
            near = difflib.get_close_matches(pat, names, n=3)
            raise PrepareError(
                f"{source} names {pat!r}, which matches no module of {type(model).__name__}"
                f"{f' (closest: {near})' if near else ''}; module names look like "
                f"{names[:4]} (use '*' for one path segment, e.g. 'layers.*.attn.q_proj')"
            )
        for n in hits:
            out[n] = _style(n, raw)
    return out


def _check_shapes(model: nn.Module, entries: dict, tp: int) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    mods = dict(model.named_modules())
    for name, style in entries.items():
        m = mods[name]
        if not isinstance(style, (ColwiseParallel, RowwiseParallel)):
            continue
        if not isinstance(m, (nn.Linear, nn.Embedding)):
            raise PrepareError(
                f"tensor parallel {type(style).__name__} on {name!r} ({type(m).__name__}): torch's "
                "column/row styles shard nn.Linear and nn.Embedding only; leave it out of the plan"
            )
        w = m.weight
        # Linear weight [out, in]: colwise shards out (dim 0), rowwise shards in (dim 1).
        # Embedding weight [vocab, dim]: rowwise shards vocab (dim 0), colwise shards dim (dim 1).
        dim = (
            (0 if isinstance(style, ColwiseParallel) else 1)
            if isinstance(m, nn.Linear)
            else (0 if isinstance(style, RowwiseParallel) else 1)
        )
        if w.shape[dim] % tp:
            raise PrepareError(
                f"tp={tp} does not divide {name}.weight dim {dim} of size {w.shape[dim]} "
                f"({type(style).__name__}); use tp in {[t for t in range(2, w.shape[dim] + 1) if w.shape[dim] % t == 0][:6]}"
            )


def _check_hf_config(model: nn.Module, tp: int) -> None:
    """Heads, kv-heads, MLP and vocab sizes of a transformers config divisible by ``tp``."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return
    sizes = {
        k: getattr(cfg, k, None)
        for k in ("num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")
    }
    sizes = {k: v for k, v in sizes.items() if isinstance(v, int) and v > 0}
    bad = [f"{k}={v}" for k, v in sizes.items() if v % tp]
    if bad:
        g = 0
        for v in sizes.values():
            g = gcd(g, v)
        ok = [t for t in range(2, g + 1) if g % t == 0]
        raise PrepareError(
            f"tp={tp} does not divide {', '.join(bad)}; tensor parallel splits whole heads, so use tp in {ok or [1]}"
        )
    if getattr(cfg, "tie_word_embeddings", False):
        raise PrepareError(
            "tie_word_embeddings=True with tensor parallel is not supported (the embedding is "
            "sharded by vocab, the head by output); use a config with tie_word_embeddings=False"
        )


def resolve_tp_plan(
    model: nn.Module, tp: int, *, tp_plan: dict | None = None, sequence_parallel: bool = True, stage: bool = False
) -> TPPlan:
    """The plan to apply, expanded and checked; raise :class:`PrepareError` naming what to supply.

    ``stage=True``: the model is one pipeline stage, so entries for modules other stages
    own are skipped (the whole model's plan was checked before the split)."""
    own = getattr(model, "tp_plan", None)
    _check_hf_config(model, tp)  # heads split whole whichever plan splits them
    if tp_plan is not None:
        if not isinstance(tp_plan, dict) or not tp_plan:
            raise PrepareError(
                f"tp_plan={tp_plan!r}: give a dict of module patterns to styles, e.g. "
                "{'layers.*.attn.q_proj': 'colwise', 'layers.*.attn.o_proj': 'rowwise'}"
            )
        plan = TPPlan(_expand(model, tp_plan, "tp_plan=", stage), "tp_plan=", False)
    elif callable(own):
        raw = own(sequence_parallel=sequence_parallel)
        plan = TPPlan(
            _expand(model, raw, f"{type(model).__name__}.tp_plan()", stage), "model.tp_plan()", sequence_parallel
        )
    elif isinstance(own, dict) and own:
        plan = TPPlan(_expand(model, own, "the model's transformers tp_plan", stage), "transformers tp_plan", False)
    else:
        raise PrepareError(
            f"{type(model).__name__} has no tensor-parallel plan: pass tp_plan= to prepare (a dict of module "
            "patterns to 'colwise'/'rowwise'/..., e.g. {'blocks.*.attn.qkv': 'colwise', 'blocks.*.attn.proj': "
            "'rowwise'}), or give the model a tp_plan(sequence_parallel) method (see workbench.models.GPT.tp_plan); "
            "transformers models carry one in base_model_tp_plan"
        )
    _check_shapes(model, plan.entries, tp)
    return plan


def apply_tp(model: nn.Module, tp_mesh, plan: TPPlan, notes: list[str]) -> nn.Module:
    """Apply ``plan`` over ``tp_mesh``. Column-parallel outputs are local tensors, so attention
    that reshapes with ``view(b, s, -1, head_dim)`` (HF Llama) sees its ``heads / tp`` heads."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, tp_mesh, plan.entries)
    sp = (
        "sequence_parallel=True"
        if plan.sequence_parallel
        else "sequence_parallel=False"
        if plan.source == "model.tp_plan()"
        else "no sequence parallel (the plan has no sequence-parallel entries)"
    )
    notes.append(f"tensor parallel over {tp_mesh.size()} rank(s): {len(plan.entries)} modules from {plan.source}; {sp}")
    return model


def _to_param_placements(param):
    def hook(grad):
        from torch.distributed.tensor import DTensor

        if isinstance(grad, DTensor) and tuple(grad.placements) != tuple(param.placements):
            return grad.redistribute(param.device_mesh, param.placements)
        return grad

    return hook


def keep_grad_placements(model: nn.Module, notes: list[str]) -> int:
    """Hook every DTensor parameter so its gradient arrives in the parameter's placements.

    DTensor's backward leaves some gradients in another placement than their parameter:
    ``embedding_dense_backward`` has no vocab-sharded rule, so a ``RowwiseParallel``
    embedding (weight ``Shard(0)``) gets the full ``[vocab, dim]`` gradient as
    ``Replicate()`` on every tp rank; a ``SequenceParallel`` norm (weight ``Replicate()``)
    gets a ``Partial(sum)`` one. The optimizer would still step correctly (its ops
    redistribute), but the gradient memory is not what the layout says, and grad clipping
    or a reader of ``.grad`` sees a different tensor than the parameter. The hook runs per
    backward, before accumulation: ``Replicate -> Shard`` is a local slice; ``Partial ->
    Replicate`` is an all-reduce over tp. FSDP2 replaces the parameters (these hooks then
    fall away with the old tensors) and redistributes the gradients itself before its
    reduce-scatter, so this is for layouts without it. Hooks live on the tensor objects:
    register them after the last ``model.to()`` (which swaps subclass tensors, hooks and all).
    Returns how many parameters were hooked."""
    from torch.distributed.tensor import DTensor

    n = 0
    for p in model.parameters():
        if isinstance(p, DTensor) and p.requires_grad:
            p.register_hook(_to_param_placements(p))
            n += 1
    if n:
        notes.append(
            f"{n} DTensor parameters hooked so each gradient arrives in its parameter's placements "
            "(a vocab-parallel embedding's Replicate grad sliced to Shard(0), a sequence-parallel "
            "norm's Partial grad all-reduced over tp)"
        )
    return n
