"""What a rank sees of itself: ``from workbench import engine`` inside ``%%distrain``.

``engine.rank``, ``engine.world_size``, ``engine.local_rank``,
``engine.local_world_size``, ``engine.device``, ``engine.backend`` and
``engine.host`` are read from the rank's bootstrapped context, so they are always
those of the live process group. ``engine.prepare`` lays a model out, ``engine.Trainer``
trains it (``%distrain train start`` drives the newest one), ``engine.load_pretrained``
reads Hugging Face weights into it. Engine-side code never imports ipywidgets or plotly.
"""

from __future__ import annotations

from . import runtime

_CONTEXT_FIELDS = {
    "rank",
    "world_size",
    "local_rank",
    "local_world_size",
    "device",
    "backend",
    "host",
    "pid",
    "threads",
    "timeout_s",
}


_LAZY = {"Trainer": (".trainer", "Trainer"), "TrainerConfig": (".trainer", "TrainerConfig")}  # imported on first use
_LAZY["sft_dataset"] = (".sft_data", "sft_dataset")  # fine-tuning data from local files


def __getattr__(name: str):
    if name in _CONTEXT_FIELDS:
        return getattr(runtime.context(), name)
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module, __name__), attr)
    raise AttributeError(f"module 'workbench.engine' has no attribute {name!r}")


def context() -> runtime.RankContext:
    """The whole rank context (a frozen dataclass)."""
    return runtime.context()


def report(step: int, loss: float | None = None, **metrics) -> dict:
    """Send this rank's numbers for ``step`` to the notebook's dashboard and ``workbench.metrics()``."""
    from .reporting import report as _report

    return _report(step, loss, **metrics)


def prepare(model, optimizer, spec="ddp", **kwargs):
    """Lay ``model`` out across the ranks by ``spec`` (a ``StrategySpec`` or text like
    ``"fsdp2 tp=2"``); returns the ``Prepared`` (model, optimizer, layout, train_step)
    and keeps it as this rank's current model for the trainer and checkpoints."""
    from ..strategies import prepare as _prepare
    from ..strategies.meshes import adopt_with
    from . import session

    # the new model becomes current before the prepare frees unused layouts, so that the
    # previous one's groups go now if nothing else holds it (on success only)
    with adopt_with(session.set_prepared):
        prepared = _prepare(model, optimizer, spec, **kwargs)
    session.set_prepared(prepared)  # also without a process group (no layout scope ran)
    return prepared


def load_pretrained(folder: str, model=None) -> dict:
    """Read a local Hugging Face ``save_pretrained`` folder into ``model`` (default: this
    rank's current one) as it is laid out: each rank reads only its slice of each tensor."""
    from . import session
    from .checkpoint.pretrained import load_pretrained as _load

    return _load(folder, model if model is not None else session.prepared())


def prepared():
    """This rank's current ``Prepared`` (set by :func:`prepare`)."""
    from . import session

    return session.prepared()


def barrier() -> None:
    """A barrier over all ranks of the default group."""
    import torch.distributed as dist

    dist.barrier()


__all__ = sorted(_CONTEXT_FIELDS | set(_LAZY) | {"context", "barrier", "runtime", "report", "load_pretrained"})
