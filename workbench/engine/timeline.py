"""The per-rank timeline of recent steps: when each phase and collective ran inside a step.

The trainer already clocks every phase (``telemetry.PhaseClock``) and every collective it
sees (``comm_timing``); this keeps them as spans for the last ``KEEP`` steps, so the
notebook can draw a Gantt chart per rank (``%distrain timeline``) at the cost of a list
append on the step path."""

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
    """Record Python's garbage collections (a gen-2 pass over an engine's heap lands anywhere
    in a step; without it that time is unexplained on the timeline)."""
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


def record(*, run: str, rank: int, step: int, t0: float, t1: float, phases, comm, ddp=None) -> dict:
    """Keep one step's spans. ``t0``/``t1``: the step's ``perf_counter`` bounds; ``phases``:
    ``(name, start, end)``; ``comm``: ``(kind, start, end, blocking)`` (only those inside the
    step are kept); ``ddp``: ``(comm_s, exposed_s, rebuilt)`` of DDP's reducer for this step, or None.

    The record (a plain dict, ``TIMELINE_VERSION``): ``run``, ``rank``, ``step``, ``wall_start``
    (epoch s), ``duration`` and ``spans`` of ``{name, lane, start, end, wait}``, seconds from the
    step's start, plus ``notes`` (what the spans cannot show). Lane ``phase``: the trainer's
    phases and ``agreement``; lane ``comm``: collectives by kind. ``wait`` marks time the rank
    sat blocked. DDP's reducer gives durations only: its span ends where backward ended, the
    exposed part last. Ranks on one host share ``time.time()``; across hosts, clocks align steps."""
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
