"""The rank's working set: the model most recently laid out with ``engine.prepare``.

The trainer, checkpoints, the layout picture and the planner's "plan what is on the
ranks" all need to find "the model on the ranks" without the user passing it to
every command; this is the one place it is kept. Per process, never global across
ranks (each rank has its own).
"""

from __future__ import annotations

_PREPARED = None


def set_prepared(prepared) -> None:
    """Remember ``prepared`` as this rank's current model."""
    global _PREPARED
    _PREPARED = prepared


def prepared():
    """The current :class:`workbench.strategies.Prepared`; a clear error if there is none."""
    if _PREPARED is None:
        raise RuntimeError(
            "no model is laid out on this rank yet: call `engine.prepare(model, optimizer, spec)` "
            "(or `%distrain prepare ...`) first"
        )
    return _PREPARED


def has_prepared() -> bool:
    return _PREPARED is not None


def clear() -> None:
    global _PREPARED
    _PREPARED = None
