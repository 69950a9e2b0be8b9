"""The rank's working set: the model most recently laid out with ``engine.prepare``.

The trainer, checkpoints, the layout picture and the planner's "plan what is on the
ranks" all need to find "the model on the ranks" without the user passing it to
every command; this is the one place it is kept. Per process, never global across
ranks (each rank has its own).
"""

from __future__ import annotations

_PREPARED = None
_JAX_LAYOUT: dict | None = None  # a JAX rank's arrays as described by ``engine.describe_jax``


def set_prepared(prepared) -> None:
    """Remember ``prepared`` as this rank's current model."""
    global _PREPARED
    _PREPARED = prepared


def set_jax_layout(layout: dict) -> None:
    """Remember the layout of a JAX rank's arrays: ``%distrain layout`` draws it."""
    global _JAX_LAYOUT
    _JAX_LAYOUT = layout


def current_layout() -> dict:
    """The layout description the picture draws: the prepared torch model's, else the JAX arrays'."""
    if _PREPARED is None and _JAX_LAYOUT is not None:
        return _JAX_LAYOUT
    return prepared().layout


def prepared():
    """The current :class:`workbench.strategies.Prepared`; a clear error if there is none."""
    if _PREPARED is None:
        raise RuntimeError(
            "no model is laid out on this rank yet: call `engine.prepare(model, optimizer, spec)` "
            "(or `%distrain prepare ...`) first; on JAX ranks, `engine.describe_jax(params)`"
        )
    return _PREPARED


def has_prepared() -> bool:
    return _PREPARED is not None


def clear() -> None:
    global _PREPARED, _JAX_LAYOUT
    _PREPARED = None
    _JAX_LAYOUT = None


def prepare(model, optimizer, spec="ddp", **kwargs):
    """``engine.prepare``: lay the model out and keep the result as this rank's current one."""
    from ..strategies import prepare as _prepare
    from ..strategies.meshes import adopt_with
    from .runtime import refuse_unless_torch

    refuse_unless_torch("engine.prepare")
    # the new model becomes current before the prepare frees unused layouts, so that the
    # previous one's groups go now if nothing else holds it (on success only)
    with adopt_with(set_prepared):
        prepared = _prepare(model, optimizer, spec, **kwargs)
    set_prepared(prepared)  # also without a process group (no layout scope ran)
    return prepared
