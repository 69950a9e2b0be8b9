"""The pipeline schedule as it ran: microbatch x stage forward/backward blocks over time.

Input: each stage's ``PipelinePrepared.last_run`` (plain dicts: the blocks its
``forward_one_chunk`` / ``backward_one_chunk`` calls took, in its own clock, plus the
schedule's own order). Drawn on one time axis (ranks on one host share ``time.time()``),
beside the bubble as lab 04 computes it: measured (:func:`measured_bubble`), by the formula
(:func:`formula_bubble`), by the formula for the stages as they ran (:func:`staged_bubble`)
and replayed from the measured blocks (:func:`replayed_bubble`).
"""

from __future__ import annotations

__all__ = [
    "schedule_order",
    "measured_bubble",
    "formula_bubble",
    "staged_bubble",
    "replayed_bubble",
    "drawn_order",
    "schedule_figure",
]

COLORS = {"F": "#4C78A8", "B": "#F58518"}


def schedule_order(schedule: str, stage: int, p: int, m: int) -> list[list]:
    """The order a stage computes in, by the schedule's definition (what lab 04 writes by hand):
    GPipe all ``m`` forwards then all backwards; 1F1B (PipeDream-Flush) ``min(p - stage - 1, m)``
    warm-up forwards, then one forward and one backward in turn, then the remaining backwards."""
    if schedule == "gpipe":
        return [["F", i] for i in range(m)] + [["B", i] for i in range(m)]
    if schedule != "1f1b":
        raise ValueError(f"unknown pipeline schedule {schedule!r}: gpipe or 1f1b")
    warmup = min(p - stage - 1, m)
    out = [["F", i] for i in range(warmup)]
    for i in range(m - warmup):
        out += [["F", warmup + i], ["B", i]]
    return out + [["B", i] for i in range(m - warmup, m)]


def _check(runs: list[dict]) -> list[dict]:
    runs = sorted((r for r in runs if r), key=lambda r: r["stage"])
    if not runs:
        raise ValueError("no pipeline step has run on these ranks: prepare with `pp` and run a train_step first")
    p = runs[0]["n_stages"]
    if [r["stage"] for r in runs] != list(range(p)):
        raise ValueError(f"need the latest step of every stage 0..{p - 1}, got stages {[r['stage'] for r in runs]}")
    return runs


def _span(runs: list[dict]) -> tuple[float, float]:
    starts = [r["wall_start"] + b[2] for r in runs for b in r["blocks"]]
    ends = [r["wall_start"] + b[3] for r in runs for b in r["blocks"]]
    return min(starts), max(ends)


def measured_bubble(runs: list[dict]) -> list[float]:
    """Idle fraction of the step per stage, from the blocks as they ran: ``1 - busy / step``, the
    step from the first block of any stage to the last."""
    runs = _check(runs)
    a, b = _span(runs)
    return [1 - sum(e - s for _, _, s, e in r["blocks"]) / (b - a) for r in runs]


def formula_bubble(p: int, m: int) -> float:
    """``(p - 1) / (m + p - 1)`` (GPipe, Huang et al. 2019; the same for 1F1B)."""
    return (p - 1) / (m + p - 1)


def _stage_times(runs: list[dict]) -> list[float]:
    return [sum(e - s for _, _, s, e in r["blocks"]) / r["microbatches"] for r in runs]


def staged_bubble(runs: list[dict]) -> float:
    """The formula for stages as they ran, ``1 - m mean(t) / (sum(t) + (m - 1) max(t))`` with
    ``t_s`` a stage's forward + backward time per micro-batch (:func:`formula_bubble` when the
    stages are equal)."""
    runs = _check(runs)
    t, m = _stage_times(runs), runs[0]["microbatches"]
    return 1 - m * (sum(t) / len(t)) / (sum(t) + (m - 1) * max(t))


def replayed_bubble(runs: list[dict]) -> float:
    """Lab 04's replay: each stage's ops in their order with the stage's mean F / B time, every op
    starting when its stage is free and its input has arrived."""
    runs = _check(runs)
    ops = []
    for r in runs:
        mean = {}
        for k in ("F", "B"):
            d = [e - s for kk, _, s, e in r["blocks"] if kk == k]
            mean[k] = sum(d) / max(1, len(d))
        ops.append([(k, i, mean[k]) for k, i, _, _ in sorted(r["blocks"], key=lambda b: b[2])])
    P = len(ops)
    end, free, nxt = {}, [0.0] * P, [0] * P
    while any(nxt[s] < len(ops[s]) for s in range(P)):
        progressed = False
        for s in range(P):
            if nxt[s] == len(ops[s]):
                continue
            kind, i, dur = ops[s][nxt[s]]
            dep = (s - 1, "F", i) if kind == "F" and s > 0 else (s + 1, "B", i) if kind == "B" and s < P - 1 else None
            if dep is not None and dep not in end:
                continue
            start = max(free[s], end[dep] if dep else 0.0)
            end[(s, kind, i)] = free[s] = start + dur
            nxt[s] += 1
            progressed = True
        if not progressed:
            raise ValueError("the recorded blocks deadlock when replayed: they are not one schedule's step")
    step = max(free)
    return sum(1 - sum(d for _, _, d in o) / step for o in ops) / P


def drawn_order(runs: list[dict]) -> dict[int, list[list]]:
    """{stage: [[kind, microbatch], ...]} in the order the blocks ran (start time)."""
    return {r["stage"]: [[k, i] for k, i, _, _ in sorted(r["blocks"], key=lambda b: b[2])] for r in _check(runs)}


def schedule_figure(runs: list[dict]):
    """Gantt chart: one row per stage, a block per micro-batch forward (F) and backward (B)."""
    import plotly.graph_objects as go

    runs = _check(runs)
    origin, _ = _span(runs)
    p, m, name = runs[0]["n_stages"], runs[0]["microbatches"], runs[0]["schedule"]
    fig = go.Figure()
    for kind in ("F", "B"):
        x, base, y, text = [], [], [], []
        for r in runs:
            for k, i, s, e in r["blocks"]:
                if k != kind:
                    continue
                base.append((r["wall_start"] + s - origin) * 1e3)
                x.append((e - s) * 1e3)
                y.append(f"stage {r['stage']}")
                text.append(f"{k}{i}")
        fig.add_bar(
            name={"F": "forward", "B": "backward"}[kind],
            orientation="h",
            x=x,
            base=base,
            y=y,
            text=text,
            textposition="inside",
            insidetextanchor="middle",
            marker_color=COLORS[kind],
            hovertext=[f"{t}: {d:.2f} ms" for t, d in zip(text, x)],
            hoverinfo="text",
        )
    per_stage = measured_bubble(runs)
    mean = sum(per_stage) / len(per_stage)
    fig.update_layout(
        title=(
            f"{name} as it ran, p={p} stages, m={m} micro-batches: bubble {replayed_bubble(runs):.2f} "
            f"(lab 04's replay of the measured blocks)<br><sub>formula (p-1)/(m+p-1) = "
            f"{formula_bubble(p, m):.2f}; for the stages as they ran {staged_bubble(runs):.2f}; "
            f"wall clock {mean:.2f} (stages {', '.join(f'{b:.2f}' for b in per_stage)}), sends, "
            f"receives and a busy machine included</sub>"
        ),
        barmode="overlay",
        xaxis={"title": "ms from the step's first block"},
        yaxis={"categoryorder": "array", "categoryarray": [f"stage {s}" for s in range(p)], "autorange": "reversed"},
        height=max(220, 60 * p + 140),
        margin={"l": 10, "r": 10, "t": 70, "b": 10},
    )
    return fig
