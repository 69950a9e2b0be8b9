"""The per-rank timeline of recent steps: when each phase and collective ran inside a step.

The trainer already clocks every step (``telemetry.PhaseClock``: data, forward, backward,
optimizer; on GPU from CUDA events at the phase boundaries, read at the step's end, so a
span is device time) and every collective it sees (``comm_timing``: Python-called collectives with their
start and end; DDP's bucket all-reduces from the reducer's own clock). This keeps those
as spans for the last ``KEEP`` steps, so the notebook can draw a Gantt chart per rank
(``%distrain timeline``) without any extra cost on the step path beyond a list append.

A record (plain dict, version 1)::

    {"version": 1, "run", "rank", "step", "wall_start": epoch s, "duration": s,
     "spans": [{"name", "lane": "phase" | "comm", "start": s, "end": s, "wait": bool}],
     "notes": [str]}   # what the spans cannot show (a collective no wrapper sees)

``start``/``end`` are seconds from the step's start. Lanes: ``phase`` holds the trainer's
phases and ``agreement`` (the wait for the ranks' per-step flag and loss exchange);
``comm`` holds collectives by kind. ``wait`` marks time the rank sat blocked: synchronous
collectives, the agreement, and DDP's exposed all-reduce (the part of the bucket
all-reduces after backward compute ended). DDP's reducer gives durations, not start
times: its span is placed to end where backward ended, its exposed part last.
Ranks on one host share ``time.time()``; across hosts, steps are aligned by their clocks.
"""

from __future__ import annotations

import gc
import threading
import time
from collections import deque

__all__ = ["KEEP", "record", "recent", "clear", "watch_gc"]

KEEP = 200
TIMELINE_VERSION = 1
_RECORDS: deque = deque(maxlen=KEEP)
_LOCK = threading.Lock()
_GC: deque = deque(maxlen=256)  # (start, end) of Python's garbage collections, perf_counter time
_GC_START: list[float] = []


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _GC_START[:] = [time.perf_counter()]
    elif _GC_START:
        _GC.append((_GC_START[0], time.perf_counter()))


def watch_gc() -> None:
    """Record Python's garbage collections (a gen-2 pass over an engine's heap takes ~10 ms
    and lands anywhere in a step; without it that time is unexplained on the timeline)."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


def record(*, run: str, rank: int, step: int, t0: float, t1: float, phases, comm, ddp=None) -> dict:
    """Keep one step's spans. ``t0``/``t1``: the step's ``perf_counter`` bounds; ``phases``:
    ``(name, start, end)``; ``comm``: ``(kind, start, end, blocking)`` (only those inside the
    step are kept); ``ddp``: ``(comm_s, exposed_s, rebuilt)`` of DDP's reducer for this step, or None."""
    wall_start = time.time() - (time.perf_counter() - t0)
    spans = [
        {"name": name, "lane": "phase", "start": a - t0, "end": b - t0, "wait": name == "agreement"}
        for name, a, b in phases
    ]
    for kind, a, b, blocking in comm:
        if a >= t0 and b <= t1:
            spans.append({"name": kind, "lane": "comm", "start": a - t0, "end": b - t0, "wait": bool(blocking)})
    for a, b in list(_GC):
        if a >= t0 and b <= t1:
            spans.append({"name": "python gc", "lane": "phase", "start": a - t0, "end": b - t0, "wait": False})
    notes = []
    if ddp is not None:
        ends = [s["end"] for s in spans if s["name"] == "backward"]
        if ddp[2]:
            notes.append(
                "DDP rebuilt its gradient buckets in this forward (a broadcast from C++, not seen): "
                "waiting in it shows as forward"
            )
        if ends:
            comm_s, exposed_s, _ = ddp
            end = ends[-1]
            spans.append(
                {
                    "name": "all_reduce (DDP buckets)",
                    "lane": "comm",
                    "start": max(0.0, end - comm_s),
                    "end": end - exposed_s,
                    "wait": False,
                }
            )
            if exposed_s > 0:
                spans.append(
                    {
                        "name": "all_reduce (DDP buckets)",
                        "lane": "comm",
                        "start": end - exposed_s,
                        "end": end,
                        "wait": True,
                    }
                )
    rec = {
        "version": TIMELINE_VERSION,
        "run": run,
        "rank": int(rank),
        "step": int(step),
        "wall_start": wall_start,
        "duration": t1 - t0,
        "spans": spans,
        "notes": notes,
    }
    with _LOCK:
        _RECORDS.append(rec)
    return rec


def recent(steps: int = 5, run: str | None = None) -> list[dict]:
    """The last ``steps`` records of this rank (of ``run``, default the latest run)."""
    with _LOCK:
        recs = list(_RECORDS)
    if not recs:
        return []
    run = run or recs[-1]["run"]
    return [r for r in recs if r["run"] == run][-steps:]


def clear() -> None:
    with _LOCK:
        _RECORDS.clear()
