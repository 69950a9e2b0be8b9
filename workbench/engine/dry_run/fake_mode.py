"""Fake tensors that answer value reads: the dry run's tensors hold no data.

``FakeTensorMode`` refuses ``.item()`` / ``float(t)`` (``aten._local_scalar_dense``): a fake
tensor has a shape, not a value. A training step reads a few values, and the answer each
gets keeps the step on its usual path: ``1.0`` for a float (the loss a train step returns,
Adam's step count, whose bias correction divides by ``1 - beta**step``), ``0`` for an integer
(the pipeline schedule's vote on static stage metadata: none was given, so every stage
infers it, as live ranks do), ``False`` for a bool.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

__all__ = ["DryFakeMode", "value_read"]

_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default


def value_read(dtype: torch.dtype):
    """What reading one value of a fake tensor of ``dtype`` gives (see the module doc)."""
    if dtype == torch.bool:
        return False
    return 1.0 if dtype.is_floating_point or dtype.is_complex else 0


class DryFakeMode(FakeTensorMode):
    """``FakeTensorMode`` (non-fake inputs allowed: the dry run's meshes hold real rank
    tensors) whose value reads answer with :func:`value_read`."""

    def __init__(self):
        super().__init__(allow_non_fake_inputs=True)

    def _dispatch_impl(self, func, types, args, kwargs):
        if func is _LOCAL_SCALAR:
            return value_read(args[0].dtype)
        return super()._dispatch_impl(func, types, args, kwargs)
