"""The event schema shared by the ranks and the notebook: plain dicts, JSON on the wire.

Ranks and notebook are different processes (maybe hosts, maybe versions of this package
after an edit), so what crosses is plain data with a version number, never pickled objects:
a rank can never make the notebook run code, and a schema change is a clear error instead of
a silent misread. Every event carries ``v``, ``kind``, ``run``, ``rank``, ``seq`` (per rank,
so gaps and duplicates show) and ``time`` (the rank's wall clock)."""

from __future__ import annotations

import json
import math
import time

SCHEMA_VERSION = 1
KINDS = ("step", "status", "log")
STATES = ("idle", "running", "paused", "stopped", "finished", "error")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv", "barrier")

# Metric names (torchtitan's where it has one). Units are in the name where not obvious.
STEP_TIME_PHASES = ("data", "forward", "backward", "optimizer", "comm_wait")
METRIC_DOCS = {
    "loss": "training loss of the step, averaged over the data-parallel ranks",
    "loss_local": "this rank's own loss before averaging",
    "lr": "learning rate of the first parameter group",
    "grad_norm": "total gradient norm before clipping",
    "tps": "tokens per second on this rank",
    "samples_per_s": "samples (sequences) per second on this rank",
    "mfu": "model FLOPs utilisation, 0-1 (None where the device peak is unknown, e.g. CPU)",
    "time_step_s": "wall time of the whole step",
    **{f"time_{p}_s": f"time of the step spent in {p}" for p in STEP_TIME_PHASES},
    "time_control_s": "time of the per-step agreement of the ranks (pause/stop/set flags, with the loss)",
    "memory_rss_bytes": "resident set size of the rank process (CPU)",
    "memory_uss_bytes": "unique set size of the rank process (CPU)",
    "memory_max_rss_bytes": "peak resident set size so far (CPU)",
    "memory_active_bytes": "GPU memory allocated by tensors now",
    "memory_reserved_bytes": "GPU memory held by the caching allocator now",
    "memory_max_active_bytes": "peak GPU memory allocated by tensors",
    "memory_max_reserved_bytes": "peak GPU memory held by the caching allocator",
    "memory_allocated_bytes": "GPU memory in allocated blocks now (torch.cuda.memory_allocated)",
    "memory_max_allocated_bytes": "peak GPU memory in allocated blocks (torch.cuda.max_memory_allocated)",
}


class SchemaError(ValueError):
    """An event this version of the workbench cannot read."""


_SEQ: dict = {}


def _next_seq(run: str, rank: int) -> int:
    key = (run, rank)
    _SEQ[key] = _SEQ.get(key, -1) + 1
    return _SEQ[key]


def _clean(value):
    """Numbers JSON can carry: NaN/Inf become strings so that they survive the trip."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def number(value):
    """The inverse of the NaN/Inf encoding: a float (or None) from a wire value."""
    if value is None:
        return None
    if isinstance(value, str):
        return float(value)
    return value


def step_event(
    *,
    run: str,
    rank: int,
    step: int,
    metrics: dict,
    comm: dict | None = None,
    source: str = "trainer",
    t: float | None = None,
) -> dict:
    """One step record of one rank: ``metrics`` (name -> number or None; torchtitan's names:
    ``loss``, ``grad_norm``, ``tps``, ``mfu``, ``memory_max_active_bytes``...), ``comm``
    (collective kind -> count/bytes/time_s during the step) and ``source`` (``trainer``, or
    ``user`` for ``engine.report``)."""
    return {
        "v": SCHEMA_VERSION,
        "kind": "step",
        "run": run,
        "rank": int(rank),
        "seq": _next_seq(run, rank),
        "time": time.time() if t is None else t,
        "step": int(step),
        "source": source,
        "metrics": {k: _clean(v) for k, v in metrics.items()},
        "comm": {k: {f: _clean(x) for f, x in d.items()} for k, d in (comm or {}).items()},
    }


def status_event(*, run: str, rank: int, state: str, step: int, reason: str = "") -> dict:
    """The trainer changed ``state`` at ``step``, with a human ``reason``."""
    if state not in STATES:
        raise SchemaError(f"unknown trainer state {state!r}: one of {', '.join(STATES)}")
    return {
        "v": SCHEMA_VERSION,
        "kind": "status",
        "run": run,
        "rank": int(rank),
        "seq": _next_seq(run, rank),
        "time": time.time(),
        "state": state,
        "step": int(step),
        "reason": reason,
    }


def log_event(*, run: str, rank: int, text: str) -> dict:
    """A line of text worth showing in the status line."""
    return {
        "v": SCHEMA_VERSION,
        "kind": "log",
        "run": run,
        "rank": int(rank),
        "seq": _next_seq(run, rank),
        "time": time.time(),
        "text": text,
    }


def encode(events: list[dict]) -> bytes:
    """A batch of events as one wire message."""
    return json.dumps(events, separators=(",", ":")).encode()


def decode(data: bytes) -> list[dict]:
    """A wire message back to events; refuses other schema versions with a clear error."""
    events = json.loads(data)
    for e in events:
        if e.get("v") != SCHEMA_VERSION:
            raise SchemaError(
                f"event schema v{e.get('v')} from rank {e.get('rank')} but this notebook reads "
                f"v{SCHEMA_VERSION}: restart the ranks (`%distrain restart`) so both run the same code"
            )
    return events


def flat_metrics(event: dict) -> dict:
    """A step event's numbers as one flat dict: metrics plus ``comm/<kind>/<field>``."""
    out = {k: number(v) for k, v in event["metrics"].items()}
    for kind, fields in event.get("comm", {}).items():
        for f, x in fields.items():
            out[f"comm/{kind}/{f}"] = number(x)
    return out
