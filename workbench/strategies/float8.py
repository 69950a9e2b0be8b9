"""fp8 training through torchao's float8 (Micikevicius et al. 2022, "FP8 Formats for Deep
Learning"): each block's ``nn.Linear`` becomes a ``Float8Linear``; weights, optimizer state
and master copies keep their dtype, the embedding and head stay in high precision.

Hardware fp8 matmuls need CUDA SM >= 8.9 and both dimensions divisible by 16; elsewhere
torchao emulates the casts and scales (``fp8_emulate=true``: fp8's numerics, none of its
speed), which is how CPU ranks test conversion, layout and loss. Naive form: docs/strategies.md."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from .base import PrepareError

__all__ = ["FP8_MIN_CAPABILITY", "check_fp8", "apply_fp8", "mark_fp8_layout"]

FP8_MIN_CAPABILITY = (8, 9)
KEEP_HIGH = ("output", "lm_head", "head")  # module names kept in high precision (the logits)
DIVISOR = 16  # torch._scaled_mm: both dims of each fp8 operand are multiples of 16


def _candidates(model: nn.Module, blocks) -> list[tuple[str, nn.Linear]]:
    """Every ``nn.Linear`` inside a block, by its module path (the head and embedding are outside)."""
    if blocks is None:
        return [
            (n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.split(".")[-1] not in KEEP_HIGH
        ]
    names = dict((id(m), n) for n, m in model.named_modules())
    out = []
    for block in blocks.modules:
        base = names[id(block)]
        out += [(f"{base}.{n}", m) for n, m in block.named_modules() if isinstance(m, nn.Linear)]
    return out


def _tp_split(name: str, tp_plan: dict | None) -> str | None:
    """``"colwise"`` / ``"rowwise"`` when the TP plan shards this linear (its local dims shrink)."""
    if not tp_plan:
        return None
    import fnmatch

    for pattern, style in tp_plan.items():
        if fnmatch.fnmatchcase(name, pattern) or name.endswith("." + pattern):
            text = (style if isinstance(style, str) else type(style).__name__).lower()
            return "colwise" if "colwise" in text else "rowwise" if "rowwise" in text else None
    return None


def check_fp8(model: nn.Module, spec, blocks, tp: int, tp_plan: dict | None, device: torch.device) -> list[str]:
    """Raise :class:`PrepareError` where fp8 cannot run; the linears to convert. Pure: nothing changes."""
    if device.type == "cuda" and not spec.fp8_emulate:
        cap = torch.cuda.get_device_capability(device)
        if cap < FP8_MIN_CAPABILITY:
            name = torch.cuda.get_device_name(device)
            raise PrepareError(
                f"fp8={spec.fp8!r} needs fp8 matmuls (CUDA SM >= 8.9: Ada, Hopper, Blackwell); {name} is SM "
                f"{cap[0]}.{cap[1]}. Use param_dtype=bf16 without fp8, or fp8_emulate=true for fp8 numerics without speed"
            )
    found = _candidates(model, blocks)
    if not found:
        raise PrepareError(
            f"fp8={spec.fp8!r}: no nn.Linear inside the model's blocks to convert (fp8 applies to block linears; "
            "the embedding and head stay in high precision); drop fp8"
        )
    bad = []
    for name, lin in found:
        out_f, in_f = lin.out_features, lin.in_features
        split = _tp_split(name, tp_plan) if tp > 1 else None
        out_f, in_f = (out_f // tp if split == "colwise" else out_f), (in_f // tp if split == "rowwise" else in_f)
        if out_f % DIVISOR or in_f % DIVISOR:
            bad.append(f"{name} ({in_f}->{out_f}{' per tp rank' if split else ''})")
    if bad:
        raise PrepareError(
            f"fp8={spec.fp8!r}: fp8 matmuls need both dimensions of every block linear divisible by {DIVISOR}; "
            f"not: {', '.join(bad[:6])}{' ...' if len(bad) > 6 else ''}. Use model dimensions that are multiples of "
            f"{DIVISOR}{' x tp' if tp > 1 else ''}, or drop fp8"
        )
    return [n for n, _ in found]


def fp8_config(spec, fsdp: bool):
    """torchao's recipe for ``spec.fp8``; under FSDP2 with tensorwise scaling the weights are
    all-gathered in fp8 (half of bf16's bytes), which torchao does for tensorwise only."""
    from torchao.float8 import Float8LinearConfig

    cfg = Float8LinearConfig.from_recipe_name(spec.fp8)
    return dataclasses.replace(
        cfg, emulate=spec.fp8_emulate, enable_fsdp_float8_all_gather=fsdp and spec.fp8 == "tensorwise"
    )


def apply_fp8(model: nn.Module, spec, names: list[str], fsdp: bool, notes: list[str]) -> None:
    """Swap the checked linears (``names``, from :func:`check_fp8`) for ``Float8Linear`` in place."""
    from torchao.float8 import convert_to_float8_training

    wanted = set(names)
    cfg = fp8_config(spec, fsdp)
    convert_to_float8_training(model, config=cfg, module_filter_fn=lambda m, fqn: fqn in wanted)
    gather = (
        "; weights all-gathered in fp8"
        if cfg.enable_fsdp_float8_all_gather
        else f"; weights all-gathered in {spec.param_dtype} (torchao's fp8 all-gather is tensorwise only)"
        if fsdp
        else ""
    )
    notes.append(
        f"fp8 ({spec.fp8} scaling{', emulated: fp8 numerics, high-precision matmuls' if spec.fp8_emulate else ''}): "
        f"{len(names)} block linears -> Float8Linear (E4M3 forward, E5M2 gradients); embedding and head in "
        f"{spec.param_dtype}{gather}"
    )


def mark_fp8_layout(layout: dict, model: nn.Module, spec) -> None:
    """Mark each ``Float8Linear`` weight in the layout (``"compute": "fp8 rowwise"``): the
    layout picture shows which matmuls run in fp8; storage keeps the parameter's dtype."""
    from torchao.float8.float8_linear import Float8Linear

    owners = {name for name, m in model.named_modules() if isinstance(m, Float8Linear)}
    label = f"fp8 {spec.fp8}" + (" (emulated)" if spec.fp8_emulate else "")
    for e in layout["params"]:
        if e["name"].rsplit(".", 1)[0] in owners:
            e["compute"] = label
