"""The shapes of batch the trainer understands, and the forward + loss of each (rank side).

``(x, y)``, a dict passed as ``model(**batch)``, or anything with ``step_fn=`` (the forms
users read in docs/strategies.md); any other batch is refused with one message naming what
was received and what would work."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch

__all__ = ["BadBatch", "form_of", "describe", "to_device", "counts", "forward_loss"]

PAIR, MAPPING, CUSTOM = "(x, y)", "dict", "step_fn"


class BadBatch(TypeError):
    """The data gave a batch the trainer cannot use."""


def describe(batch, depth: int = 0) -> str:
    """A short description of a batch: ``tuple of 3 (Tensor[8, 32] int64, ...)``."""
    if isinstance(batch, torch.Tensor):
        return f"Tensor{list(batch.shape)} {str(batch.dtype).replace('torch.', '')}"
    if isinstance(batch, Mapping):
        if depth:
            return f"dict of {len(batch)}"
        items = list(batch.items())[:6]
        return (
            "dict {"
            + ", ".join(f"{k!r}: {describe(v, 1)}" for k, v in items)
            + (", ..." if len(batch) > 6 else "")
            + "}"
        )
    if isinstance(batch, (tuple, list)):
        name = type(batch).__name__
        if depth:
            return f"{name} of {len(batch)}"
        return (
            f"{name} of {len(batch)} ("
            + ", ".join(describe(v, 1) for v in batch[:6])
            + (", ..." if len(batch) > 6 else "")
            + ")"
        )
    return type(batch).__name__


def form_of(batch, *, step_fn=None, rank: int = 0) -> str:
    """Which of the understood forms ``batch`` is; :class:`BadBatch` naming it otherwise."""
    if step_fn is not None:
        return CUSTOM
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch):
        return PAIR
    if isinstance(batch, Mapping) and batch and all(isinstance(k, str) for k in batch):
        return MAPPING
    raise BadBatch(
        f"rank {rank}: the data gave a batch the trainer cannot use: {describe(batch)}. It takes (x, y) "
        "(two tensors: model(x), then the loss of the output against y), a dict of named inputs passed as "
        "model(**batch) (with labels= for a model that computes its loss, or loss_fn=(outputs, batch) -> loss), "
        "or any batch with step_fn=(model, batch) -> loss"
    )


def to_device(batch, device: torch.device):
    """The batch with every tensor in it moved to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device) for k, v in batch.items()}  # a plain dict: model(**batch)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(v, device) for v in batch)
    return batch


def _first_tensor(batch):
    if isinstance(batch, torch.Tensor):
        return batch
    if isinstance(batch, Mapping):
        if isinstance(batch.get("input_ids"), torch.Tensor):
            return batch["input_ids"]
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        for v in batch:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def counts(batch) -> tuple[int, int, tuple | None]:
    """(tokens, samples, input shape) of a batch: its inputs' elements, first dimension, shape."""
    t = _first_tensor(batch)
    if t is None:
        return 0, 0, None
    return t.numel(), (t.shape[0] if t.dim() else 1), tuple(t.shape)


def forward_loss(
    model, batch, form: str, *, loss_fn=None, compute_loss=None, step_fn=None, rank: int = 0, autocast=None
):
    """The loss tensor of ``batch`` (already on the device) under ``form``; ``autocast``: a
    context factory around the model's forward (a pair's loss is taken outside it, in fp32).

    A pair: ``loss_fn(model(x), y)``, else the strategy's loss (next-token cross entropy, plus
    a model's ``aux_loss()``); a dict: ``loss_fn(out, batch)``, else ``out.loss`` (labels
    pass through as they are); ``step_fn(model, batch)`` otherwise."""
    ctx = autocast or contextlib.nullcontext
    if form == CUSTOM:
        with ctx():
            loss = step_fn(model, batch)
        what = "step_fn(model, batch)"
    elif form == PAIR:
        x, y = batch
        with ctx():
            out = model(x)
        return loss_fn(out, y) if loss_fn is not None else compute_loss(out, y)
    else:
        with ctx():
            out = model(**batch)
        if loss_fn is not None:
            loss = loss_fn(out, batch)
            what = "loss_fn(outputs, batch)"
        else:
            loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
            if loss is None:
                raise BadBatch(
                    f"rank {rank}: model(**batch) returned {describe(out) if not hasattr(out, 'loss') else type(out).__name__} "
                    f"with no loss for the batch {describe(batch)}: put labels in the batch (a Hugging Face model "
                    "computes its loss from them), or pass loss_fn=(outputs, batch) -> loss"
                )
            what = "outputs.loss"
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise BadBatch(f"rank {rank}: {what} must be a scalar tensor (to run backward on), got {describe(loss)}")
    return loss.reshape(())
