"""``engine.report(step=..., loss=..., **metrics)``: a user's own loop into the same stream.

A hand-written loop (plain PyTorch, Accelerate, Lightning Fabric) gets the dashboard and
``workbench.metrics()`` with one call per step: its numbers plus what the trainer measures
the same way here (step time, throughput, memory, collectives; docs/other-trainers.md). A
number the caller passes wins over the measured one of the same name."""

from __future__ import annotations

import time

from ..shared import events
from . import comm_timing, publisher, runtime, telemetry

_STATE: dict = {}


def report(
    step: int,
    loss: float | None = None,
    *,
    run: str | None = None,
    batch=None,
    source: str = "user",
    **metrics,
) -> dict:
    """Send one step record of this rank to the notebook (non-blocking); returns it."""
    from . import trainer

    ctx = runtime.context()
    if run is None:
        run = trainer._CURRENT.run if trainer._CURRENT is not None else "user"
    if "probe" not in _STATE:
        comm_timing.install()
        _STATE["probe"] = telemetry.MemoryProbe(ctx.device)
    now = time.perf_counter()
    before = _STATE.get(run)
    snap = comm_timing.STATS.snapshot()
    given = {k: (float(v) if hasattr(v, "item") else v) for k, v in metrics.items()}
    if batch is not None:
        from .batch_forms import counts

        tokens, samples, _ = counts(batch)
        given.setdefault("tokens", tokens)
        given.setdefault("samples", samples)
    values = {} if loss is None else {"loss": float(loss)}
    comm = {}
    if before is not None:
        seconds = max(now - before[0], 1e-9)
        values["time_step_s"] = seconds / max(1, step - before[2])
        if given.get("tokens") is not None:
            values["tps"] = given["tokens"] / seconds
        if given.get("samples") is not None:
            values["samples_per_s"] = given["samples"] / seconds
        comm, _ = comm_timing.CommStats.delta(snap, before[1])
    values.update(_STATE["probe"].read())
    values.update(given)
    _STATE[run] = (now, snap, step)
    event = events.step_event(run=run, rank=ctx.rank, step=step, metrics=values, comm=comm, source=source)
    if publisher.get() is None and not _STATE.get("warned"):
        _STATE["warned"] = True
        import warnings

        warnings.warn(
            f"rank {ctx.rank}: engine.report: no notebook is listening yet, so this step is not "
            "kept; ranks started with `%distrain start` are connected automatically",
            stacklevel=3,
        )
    publisher.emit(event)
    return event
