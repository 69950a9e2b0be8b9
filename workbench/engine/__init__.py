"""What a rank sees of itself: ``from workbench import engine`` inside ``%%distrain``.

``engine.rank``, ``world_size``, ``local_rank``, ``local_world_size``, ``device``, ``backend``,
``host`` and ``framework`` are read from the rank's bootstrapped context, so they are always
those of the live process group. ``engine.prepare`` lays a model out, ``engine.Trainer``
trains it, ``engine.load_pretrained`` reads Hugging Face weights into it."""

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
    "framework",
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


def __dir__() -> list[str]:
    """The rank's own names (``engine.rank``...) and the functions here: what completion and a
    debugger's variables panel list (not the lazy classes: listing them would import them)."""
    public = {n for n, v in globals().items() if callable(v) and not n.startswith("_") and v.__module__ == __name__}
    return sorted(public | _CONTEXT_FIELDS)


def context() -> runtime.RankContext:
    """The whole rank context (a frozen dataclass)."""
    return runtime.context()


def report(step: int, loss: float | None = None, *, run: str | None = None, batch=None, **metrics) -> dict:
    """Send this rank's numbers for ``step`` to the notebook's dashboard and ``workbench.metrics()``:
    the way a hand-written loop (plain, Accelerate, Lightning Fabric) reports. Step time,
    memory and collectives are measured on the rank; ``tokens=``/``samples=`` (or ``batch=``, counted)
    give ``tps``/``samples_per_s``. See :mod:`workbench.engine.reporting`."""
    from .reporting import report as _report

    return _report(step, loss, run=run, batch=batch, **metrics)


def hf_callback(run: str | None = None):
    """A ``transformers.TrainerCallback`` that streams a Hugging Face (or trl) ``Trainer``'s
    steps into the dashboard and ``workbench.metrics()`` through :func:`report`:
    ``Trainer(..., callbacks=[engine.hf_callback()])``."""
    from .hf_trainer import make_callback

    return make_callback(run)


def prepare(model, optimizer, spec="ddp", **kwargs):
    """Lay ``model`` out across the ranks by ``spec`` (a ``StrategySpec`` or text like
    ``"fsdp2 tp=2"``); returns the ``Prepared`` (model, optimizer, layout, train_step)
    and keeps it as this rank's current model for the trainer and checkpoints."""
    from .session import prepare as _prepare

    return _prepare(model, optimizer, spec, **kwargs)


def load_pretrained(folder: str, model=None) -> dict:
    """Read a local Hugging Face ``save_pretrained`` folder into ``model`` (default: this
    rank's current one) as it is laid out: each rank reads only its slice of each tensor."""
    from . import session
    from .checkpoint.pretrained import load_pretrained as _load

    return _load(folder, model if model is not None else session.prepared())


def describe_jax(params, strategy: str = "jax") -> dict:
    """Describe this JAX rank's share of ``params`` (a pytree of global ``jax.Array``s) in the
    layout schema torch models use, and keep it for ``%distrain layout`` (the same picture)."""
    from . import jax_layout, session

    ctx = runtime.context()
    layout = jax_layout.describe(params, strategy=strategy, rank=ctx.rank, world_size=ctx.world_size)
    session.set_jax_layout(layout)
    return layout


def prepared():
    """This rank's current ``Prepared`` (set by :func:`prepare`)."""
    from . import session

    return session.prepared()


def barrier() -> None:
    """A barrier over all ranks of the default group."""
    runtime.refuse_unless_torch("engine.barrier")
    import torch.distributed as dist

    dist.barrier()


__all__ = sorted(
    _CONTEXT_FIELDS
    | set(_LAZY)
    | {"context", "barrier", "runtime", "report", "hf_callback", "load_pretrained", "describe_jax"}
)
