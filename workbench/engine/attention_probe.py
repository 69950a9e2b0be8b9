"""Which attention kernel a model really runs: fused (no stored scores) or eager.

The planner's activation memory depends on it (an eager softmax(QK^T) stores the s x s
scores, a fused kernel does not), so the live census sees the step's aten ops under a
``TorchDispatchMode``, below autograd and tensor subclasses, rather than guessing from the
model's class. SDPA's "math" fallback is a plain softmax over the scores: eager, as it should."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["AttentionProbe", "FUSED_OPS"]

FUSED_OPS = (
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
    "_scaled_dot_product_fused_attention_overrideable",
)


class AttentionProbe(TorchDispatchMode):
    """Counts fused attention kernels and score softmaxes while it is entered.

    Fused: SDPA's flash / memory-efficient / cuDNN kernels (:data:`FUSED_OPS`) or
    FlashAttention's own ``flash_attn::*`` ops. Eager: ``aten._softmax`` over a 4-D tensor
    whose last two dims both exceed 1 (batch, heads, queries, keys), the score matrix.
    """

    def __init__(self):
        super().__init__()
        self.fused: dict[str, int] = {}
        self.eager = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name  # e.g. "aten::_softmax", "flash_attn::_flash_attn_forward"
        op = name.split("::", 1)[-1]
        if op in FUSED_OPS or name.startswith("flash_attn::"):
            self.fused[op] = self.fused.get(op, 0) + 1
        elif op == "_softmax" and args and _is_score_matrix(args[0]):
            self.eager += 1
        return func(*args, **(kwargs or {}))

    def kernel(self) -> str | None:
        """ "eager" if any score softmax ran, else "flash" if a fused kernel ran, else None."""
        if self.eager:
            return "eager"
        return "flash" if self.fused else None

    def evidence(self) -> str:
        """What was seen, in a line: the ops and their counts."""
        seen = [f"{op} x{n}" for op, n in sorted(self.fused.items())]
        if self.eager:
            seen.append(f"_softmax over s x s scores x{self.eager}")
        return ", ".join(seen) or "no attention op seen"


def _is_score_matrix(t) -> bool:
    shape = getattr(t, "shape", ())
    return len(shape) == 4 and shape[-1] > 1 and shape[-2] > 1


def hf_attention_implementation(model) -> str | None:
    """A Hugging Face model's configured kernel ("sdpa", "flash_attention_2", "eager")."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None) if config is not None else None
