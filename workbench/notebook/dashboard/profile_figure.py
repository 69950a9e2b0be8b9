"""Reading torch.profiler Chrome traces (plain JSON, no torch): top ops, communication vs
compute, idle per rank, and a merged per-rank timeline.

Each rank's ops are counted inside its profiled window (:func:`window`): self times
(:func:`self_times`), communication, compute and idle (:func:`rank_summary`). Holistic Trace
Analysis does this for GPU traces (it reads kernels per stream); CPU-rank traces have no
kernels, so the workbench counts from the CPU ops itself.
"""

from __future__ import annotations

import json

import pandas as pd

COMM_MARKS = ("c10d::", "gloo:", "nccl:", "record_param_comms", "ncclKernel", "ncclDevKernel")


def load_trace(path) -> dict:
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    if "traceEvents" not in trace:
        raise ValueError(f"{path}: not a Chrome trace (no traceEvents)")
    return trace


def is_comm(name: str) -> bool:
    return any(m in name for m in COMM_MARKS)


def _union(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def _minus(a: list, b: list) -> float:
    """Length of union(a) less its overlap with union(b)."""
    ua, ub = _union(a), _union(b)
    overlap, i, j = 0.0, 0, 0
    while i < len(ua) and j < len(ub):  # both sorted and disjoint: one sweep
        (x0, x1), (y0, y1) = ua[i], ub[j]
        overlap += max(0.0, min(x1, y1) - max(x0, y0))
        if x1 <= y1:
            i += 1
        else:
            j += 1
    return _length(ua) - overlap


def _ops(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]


def window(trace: dict) -> tuple[float, float, object]:
    """(start us, end us, tid) of the profiled steps: the first ``ProfilerStep#`` annotation's start
    to the last one's end, on the thread that ran them."""
    steps = [e for e in _ops(trace) if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError("the trace has no ProfilerStep# marks: it was not taken by `%distrain profile`")
    return min(e["ts"] for e in steps), max(e["ts"] + e["dur"] for e in steps), steps[0]["tid"]


def self_times(trace: dict) -> pd.DataFrame:
    """Per op name: calls, self ms, total ms (CPU ops and kernels inside the window); an op's self
    time is its duration less that of the ops directly inside it (same thread)."""
    t0, t1, _ = window(trace)
    by_thread: dict = {}
    for e in _ops(trace):
        if e.get("cat") in ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset") and t0 <= e["ts"] <= t1:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    rows: dict[str, list] = {}
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        child: dict[int, float] = {}
        for e in events:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                child[id(stack[-1])] = child.get(id(stack[-1]), 0.0) + e["dur"]
            stack.append(e)
        for e in events:
            r = rows.setdefault(e["name"], [0, 0.0, 0.0])
            r[0] += 1
            r[1] += max(0.0, e["dur"] - child.get(id(e), 0.0))
            r[2] += e["dur"]
    df = pd.DataFrame([{"op": k, "calls": c, "self_ms": s / 1e3, "total_ms": t / 1e3} for k, (c, s, t) in rows.items()])
    if df.empty:
        return df
    df["comm"] = df["op"].map(is_comm)
    return df.sort_values("self_ms", ascending=False).reset_index(drop=True)


def rank_summary(trace: dict) -> dict:
    """Window, communication, compute and idle milliseconds, the top op by self time.

    Communication: the union of collective ops (``COMM_MARKS``: ``c10d::``, ``gloo:``, ``nccl:``,
    ``record_param_comms``, NCCL kernels) on any thread or stream; compute: the union of the
    other ops on the training thread (and of GPU kernels, where there are any), less
    communication; idle: the window less both (Python between ops, waiting outside collectives)."""
    t0, t1, tid = window(trace)
    ops = [
        e
        for e in _ops(trace)
        if e.get("cat") in ("cpu_op", "kernel", "gpu_memcpy", "gpu_memset") and e["ts"] < t1 and e["ts"] + e["dur"] > t0
    ]
    clip = [(max(e["ts"], t0), min(e["ts"] + e["dur"], t1), e) for e in ops]
    comm = [(a, b) for a, b, e in clip if is_comm(e["name"])]
    compute = [
        (a, b) for a, b, e in clip if not is_comm(e["name"]) and (e.get("tid") == tid or e.get("cat") == "kernel")
    ]
    comm_us = _length(_union(comm))
    compute_us = _minus(compute, comm)
    steps = sum(1 for e in _ops(trace) if str(e.get("name", "")).startswith("ProfilerStep#"))
    top = self_times(trace)
    return {
        "steps": steps,
        "window_ms": (t1 - t0) / 1e3,
        "compute_ms": compute_us / 1e3,
        "comm_ms": comm_us / 1e3,
        "idle_ms": max(0.0, (t1 - t0) - compute_us - comm_us) / 1e3,
        "top_op": top["op"].iloc[0] if len(top) else None,
        "top_op_self_ms": float(top["self_ms"].iloc[0]) if len(top) else 0.0,
    }


def summary_table(traces: dict[int, dict]) -> pd.DataFrame:
    """One row per rank: :func:`rank_summary`."""
    return pd.DataFrame([{"rank": r, **rank_summary(t)} for r, t in sorted(traces.items())]).set_index("rank")


def top_ops(traces: dict[int, dict], n: int = 10) -> pd.DataFrame:
    """The ``n`` ops with the most self time over all ranks, with their share of it."""
    frames = [self_times(t).assign(rank=r) for r, t in traces.items()]
    df = pd.concat(frames) if frames else pd.DataFrame()
    if df.empty:
        return df
    agg = df.groupby("op").agg(
        calls=("calls", "sum"),
        self_ms=("self_ms", "sum"),
        total_ms=("total_ms", "sum"),
        comm=("comm", "first"),
        ranks=("rank", "nunique"),
    )
    agg["self_share"] = agg["self_ms"] / agg["self_ms"].sum()
    return agg.sort_values("self_ms", ascending=False).head(n).reset_index()


def profile_figure(traces: dict[int, dict], max_bars: int = 3000):
    """Merged per-rank timeline: profiled steps, then the outermost ops (compute / communication)."""
    import plotly.graph_objects as go

    origin = min(window(t)[0] for t in traces.values())
    lanes, groups = [], {"step": ([], [], [], []), "compute": ([], [], [], []), "communication": ([], [], [], [])}
    for r, t in sorted(traces.items()):
        t0, t1, tid = window(t)
        lanes += [f"rank {r} steps", f"rank {r} ops"]
        ops = sorted((e for e in _ops(t) if t0 <= e["ts"] <= t1), key=lambda e: (e["ts"], -e["dur"]))
        end = float("-inf")
        for e in ops:
            name = str(e.get("name", ""))
            if name.startswith("ProfilerStep#"):
                key, lane = "step", f"rank {r} steps"
            elif e.get("cat") in ("cpu_op", "kernel") and (e.get("tid") == tid or is_comm(name)) and e["ts"] >= end:
                key, lane = ("communication" if is_comm(name) else "compute"), f"rank {r} ops"
                end = e["ts"] + e["dur"]  # outermost ops only: what runs inside is in the summary
            else:
                continue
            x, base, y, text = groups[key]
            x.append(e["dur"] / 1e3)
            base.append((e["ts"] - origin) / 1e3)
            y.append(lane)
            text.append(f"rank {r}: {name} {e['dur'] / 1e3:.3f} ms")
    fig = go.Figure()
    colors = {"step": "#BAB0AC", "compute": "#4C78A8", "communication": "#E45756"}
    for key, (x, base, y, text) in groups.items():
        fig.add_bar(
            name=key,
            orientation="h",
            x=x[:max_bars],
            base=base[:max_bars],
            y=y[:max_bars],
            hovertext=text[:max_bars],
            hoverinfo="text",
            marker_color=colors[key],
        )
    fig.update_layout(
        title="torch.profiler, merged per rank: profiled steps and outermost ops",
        barmode="overlay",
        xaxis={"title": "ms from the first profiled step"},
        yaxis={"categoryorder": "array", "categoryarray": lanes, "autorange": "reversed"},
        height=max(260, 40 * len(lanes) + 120),
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig
