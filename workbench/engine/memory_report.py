"""Out of memory on a rank: what filled it, and which strategy change would help.

``with explain_oom(prepared, batch=(x, y)):`` around a step turns an out-of-memory error into
one of the same type whose message adds this rank's breakdown (parameters, gradients,
optimizer state, an activation estimate) and advice ranked by what dominated; the numbers
are also on the exception as ``.memory_report``."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["memory_breakdown", "advice", "format_report", "explain_oom"]

_KINDS = ("parameters", "gradients", "optimizer state", "activations (estimate)")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(t) -> int:
    if not isinstance(t, torch.Tensor):
        return 0
    t = _local(t)
    return t.numel() * t.element_size()


def _unwrap(obj):
    """(model, optimizer, strategy, spec) from a Prepared, a DeepSpeed engine or a module."""
    if hasattr(obj, "layout") and hasattr(obj, "optimizer"):
        return obj.model, obj.optimizer, obj.layout.get("strategy", "none"), getattr(obj, "spec", None)
    return obj, None, "none", None


def activation_estimate(model, batch_shape) -> int:
    """Activation bytes of a GPT-style model (Korthikanti et al. 2022, "Reducing Activation
    Recomputation in Large Transformer Models"): per layer ``s*b*h*(34 + 5*a*s/h)`` at 16-bit,
    doubled at fp32, plus the logits; 0 for a model without a ``cfg``."""
    cfg = getattr(model, "cfg", None) or getattr(getattr(model, "module", None), "cfg", None)
    if cfg is None or batch_shape is None or len(batch_shape) < 2:
        return 0
    b, s = int(batch_shape[0]), int(batch_shape[1])
    h, a, L = cfg.dim, cfg.n_heads, cfg.n_layers
    per_layer_16bit = s * b * h * (34 + 5 * a * s / h)
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    scale = 2 if dtype == torch.float32 else 1
    logits = b * s * getattr(cfg, "vocab", 0) * 4 * 2  # fp32 logits + their gradient
    return int(L * per_layer_16bit * scale + logits)


def memory_breakdown(obj, optimizer=None, *, batch_shape=None, activation_bytes: int | None = None) -> dict:
    """Bytes of this rank's parameters, gradients, optimizer state and activations (estimate)."""
    model, opt, strategy, spec = _unwrap(obj)
    opt = optimizer or opt
    inner = getattr(opt, "optimizer", opt)
    params = list(model.parameters())
    out = {
        "parameters": sum(_nbytes(p) for p in params),
        "gradients": sum(_nbytes(p.grad) for p in params if p.grad is not None),
        "optimizer state": 0,
        "activations (estimate)": activation_bytes
        if activation_bytes is not None
        else activation_estimate(model, batch_shape),
    }
    if not out["gradients"]:  # before the first backward: they will take what the trainable parameters take
        out["gradients"] = sum(_nbytes(p) for p in params if p.requires_grad)
    if inner is not None:
        for st in getattr(inner, "state", {}).values():
            out["optimizer state"] += sum(_nbytes(v) for v in st.values())
        if not out["optimizer state"] and isinstance(inner, (torch.optim.Adam, torch.optim.AdamW, torch.optim.Adamax)):
            out["optimizer state"] = 2 * out["parameters"]  # exp_avg + exp_avg_sq, not created yet
    info = {
        "bytes": out,
        "strategy": strategy,
        "spec": spec.to_dict() if hasattr(spec, "to_dict") else {},
        "world_size": _world(),
        "device": str(next((p.device for p in params), "cpu")),
    }
    if torch.cuda.is_available() and info["device"].startswith("cuda"):
        info["cuda"] = {
            "allocated": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
            "peak": torch.cuda.max_memory_allocated(),
            "total": torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory,
        }
    return info


def _world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def advice(info: dict) -> list[str]:
    """Strategy changes, most useful first, for what dominated memory."""
    b = info["bytes"]
    strategy, spec, n = info.get("strategy", "none"), info.get("spec", {}) or {}, info.get("world_size", 1)
    order = sorted(b, key=b.get, reverse=True)
    tips: list[str] = []
    sharded_params = (
        strategy in ("fsdp2", "fsdp2_tp")
        or (strategy == "pp" and (spec.get("dp_shard") or 1) > 1)
        or (strategy == "zero" and spec.get("zero_stage") == 3)
    )
    sharded_opt = sharded_params or (strategy == "zero" and spec.get("zero_stage", 0) >= 1)
    for kind in order:
        if not b[kind]:
            continue
        if kind == "optimizer state":
            if not sharded_opt:
                tips.append(
                    f"shard the optimizer state over the {n} ranks: FSDP2 (`kind=fsdp2`) or ZeRO-1/2 "
                    f"(`kind=zero zero_stage=2`): about {_fmt(b[kind] / max(n, 1))} per rank instead of {_fmt(b[kind])}"
                )
            else:
                tips.append(
                    "optimizer state is already sharded: offload it to CPU (`cpu_offload=True`), add ranks, "
                    "or use a lighter optimizer (SGD with momentum keeps one buffer instead of AdamW's two)"
                )
        elif kind in ("parameters", "gradients"):
            if not sharded_params:
                tips.append(
                    "shard parameters and gradients too: FSDP2 (`kind=fsdp2`) or ZeRO-3 (`kind=zero zero_stage=3`); "
                    "tensor parallel (`kind=tp`) also splits activations"
                )
            else:
                tips.append(
                    "parameters are sharded already: bf16 parameters (`param_dtype=bf16`), CPU offload "
                    "(`cpu_offload=True`) or more ranks"
                )
        elif kind == "activations (estimate)":
            if spec.get("activation_checkpointing", "none") == "none":
                tips.append(
                    "activation checkpointing (`activation_checkpointing=full`, or `selective`): recompute "
                    "block activations in backward instead of keeping them"
                )
            tips.append(
                "a smaller micro-batch with gradient accumulation (`grad_accum=2`: same global batch, half the "
                "activations) or a shorter sequence"
            )
    seen, out = set(), []
    for t in tips:
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def _fmt(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def format_report(info: dict, rank: int | None = None) -> str:
    b = info["bytes"]
    total = sum(b.values()) or 1
    who = f"rank {rank}" if rank is not None else "this rank"
    lines = [
        f"out of memory on {who} ({info.get('device')}, strategy {info.get('strategy')}, "
        f"{info.get('world_size')} ranks). What this rank holds:"
    ]
    for kind in sorted(b, key=b.get, reverse=True):
        lines.append(f"  {kind:<24} {_fmt(b[kind]):>11}  {100 * b[kind] / total:5.1f}%")
    if "cuda" in info:
        c = info["cuda"]
        lines.append(
            f"  device: allocated {_fmt(c['allocated'])}, reserved {_fmt(c['reserved'])}, "
            f"peak {_fmt(c['peak'])} of {_fmt(c['total'])}"
        )
    top = max(b, key=b.get)
    lines.append(f"{top} dominated. What would help:")
    lines.extend(f"  - {t}" for t in advice(info))
    return "\n".join(lines)


def _rank() -> int | None:
    try:
        from . import runtime

        return runtime.context().rank if runtime._CONTEXT else None
    except Exception:  # pragma: no cover
        return None


@contextlib.contextmanager
def explain_oom(obj, optimizer=None, *, batch=None, batch_shape=None, activation_bytes: int | None = None):
    """Re-raise an OOM inside the block with the memory report in its message.

    ``batch_shape``: a shape, or a function giving it when the OOM happens (the trainer
    knows the batch only inside the step). The trainer wraps every step in this.
    """
    try:
        yield
    except (torch.OutOfMemoryError, MemoryError) as exc:
        if getattr(exc, "memory_report", None) is not None:
            raise
        shape = tuple(batch[0].shape) if batch is not None else None
        if shape is None and batch_shape is not None:
            shape = batch_shape() if callable(batch_shape) else tuple(batch_shape)
        try:
            info = memory_breakdown(obj, optimizer, batch_shape=shape, activation_bytes=activation_bytes)
            report = format_report(info, _rank())
        except Exception as inner:  # the report must never hide the OOM
            info, report = None, f"(no memory report: {type(inner).__name__}: {inner})"
        new = type(exc)(f"{exc}\n{report}")
        new.memory_report = info
        raise new from exc
