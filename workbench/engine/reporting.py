"""``engine.report(step=..., loss=..., **metrics)``: a user's own loop into the same stream.

A user who writes their training loop by hand gets the same dashboard and
``workbench.metrics()`` table with one call per step: the numbers they pass, plus this
rank's memory, step time since the previous report and the collectives run since then.
"""

from __future__ import annotations

import time

from ..shared import events
from . import comm_timing, publisher, runtime, telemetry

_STATE: dict = {}


def report(step: int, loss: float | None = None, *, run: str | None = None, **metrics) -> dict:
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
    values = {} if loss is None else {"loss": float(loss)}
    values.update({k: (float(v) if hasattr(v, "item") else v) for k, v in metrics.items()})
    comm = {}
    if before is not None:
        values.setdefault("time_step_s", now - before[0])
        comm, _ = comm_timing.CommStats.delta(snap, before[1])
    values.update(_STATE["probe"].read())
    _STATE[run] = (now, snap)
    event = events.step_event(run=run, rank=ctx.rank, step=step, metrics=values, comm=comm, source="user")
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
