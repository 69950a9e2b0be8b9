"""A Gantt chart of the last steps on every rank: phases, collectives by kind, waiting.

Input: the ranks' timeline records (``workbench.engine.timeline``, plain dicts); nothing here
touches torch. Each rank gets two lanes: its phases (data, forward, backward, optimizer,
agreement) and its collectives (by kind, hatched where the rank sat blocked in them). The
straggler of a step is the rank that waited least: in a synchronous step the others wait for it
in the first collective they share with it, so their waiting is its lateness. Past
``bands.BAND_PAST`` ranks only some ranks get lanes (:func:`extreme_ranks`).
"""

from __future__ import annotations

import pandas as pd

from .bands import BAND_PAST

EXTREMES = 3  # past BAND_PAST ranks: this many slowest and this many fastest ranks are drawn

PHASE_COLORS = {
    "data": "#72B7B2",
    "forward": "#4C78A8",
    "backward": "#F58518",
    "optimizer": "#54A24B",
    "agreement": "#BAB0AC",
    "setup": "#D4A6C8",
    "telemetry": "#DDDDDD",
    "zero_grad": "#9ECAE9",
}
COMM_COLORS = ["#E45756", "#B279A2", "#FF9DA6", "#9D755D", "#EECA3B", "#79706E"]


def _intervals_union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def waiting_seconds(rec: dict) -> float:
    """Seconds of the step this rank sat blocked (collectives it waited in, the agreement)."""
    return _intervals_union([(s["start"], s["end"]) for s in rec["spans"] if s["wait"]])


def timeline_table(records: list[dict]) -> pd.DataFrame:
    """One row per (rank, step): step seconds, seconds per phase, blocked seconds, and the
    share of the step its phases cover."""
    rows = []
    for rec in records:
        row = {"rank": rec["rank"], "step": rec["step"], "step_s": rec["duration"]}
        phases = [s for s in rec["spans"] if s["lane"] == "phase"]
        for s in phases:
            row[f"{s['name']}_s"] = row.get(f"{s['name']}_s", 0.0) + s["end"] - s["start"]
        comm = [s for s in rec["spans"] if s["lane"] == "comm"]
        for s in comm:
            row[f"comm {s['name']}_s"] = row.get(f"comm {s['name']}_s", 0.0) + s["end"] - s["start"]
        row["waiting_s"] = waiting_seconds(rec)
        row["covered"] = _intervals_union([(s["start"], s["end"]) for s in phases]) / max(rec["duration"], 1e-12)
        row["notes"] = "; ".join(rec.get("notes", []))
        rows.append(row)
    df = pd.DataFrame(rows)
    return df.fillna(0.0).sort_values(["step", "rank"]).reset_index(drop=True) if rows else df


def stragglers(records: list[dict]) -> dict[int, int]:
    """{step: the rank that waited least in it} over steps seen on more than one rank.

    Steps where some rank's record says a wait is hidden (a collective no wrapper sees,
    see ``engine.timeline``) are left out: its waiting would be read as work.
    """
    table = timeline_table(records)
    out = {}
    for step, grp in table.groupby("step"):
        if len(grp) > 1 and not grp["notes"].astype(bool).any():
            out[int(step)] = int(grp.loc[grp["waiting_s"].idxmin(), "rank"])
    return out


def _straggler(late: dict[int, int]) -> int | None:
    """The rank most often the straggler over the judged steps (None when none was judged)."""
    return int(pd.Series(list(late.values())).value_counts().index[0]) if late else None


def extreme_ranks(records: list[dict], k: int = EXTREMES) -> dict[int, list[str]]:
    """{rank: why it is drawn} for a chart of many ranks: the ``k`` slowest and ``k`` fastest
    ranks by their mean time working (the step less the time blocked), and the straggler;
    slowest first, fastest last. Two lanes for every rank would be thousands of lanes; the
    straggler is judged over every rank."""
    table = timeline_table(records)
    work = (table["step_s"] - table["waiting_s"]).groupby(table["rank"]).mean().sort_values(ascending=False)
    order = [int(r) for r in work.index]
    why: dict[int, list[str]] = {}
    for r in order[:k]:
        why.setdefault(r, []).append("slowest")
    straggler = _straggler(stragglers(records))
    if straggler is not None:
        why.setdefault(straggler, []).append("straggler")
    for r in order[-k:]:
        why.setdefault(r, []).append("fastest")
    return {r: why[r] for r in order if r in why}


def _ranks_list(ranks: list[int]) -> str:
    """``0, 1, 3`` for a few ranks, ``0-511,513-1023`` past ``BAND_PAST``."""
    if len(ranks) <= BAND_PAST:
        return ", ".join(map(str, ranks))
    from ...shared.ranges import format_ranks

    return format_ranks(ranks)


def timeline_figure(records: list[dict], *, every_rank: bool = False):
    """Per-rank Gantt chart of the recorded steps (milliseconds from the first step's start).

    Past ``BAND_PAST`` ranks only the slowest, the fastest and the straggler are drawn (see
    :func:`extreme_ranks`) unless ``every_rank``.
    """
    import plotly.graph_objects as go

    if not records:
        raise ValueError(
            "no steps recorded on the ranks yet: train a few steps (`%distrain train start --steps 5`) and ask again"
        )
    origin = min(r["wall_start"] for r in records)
    ranks = sorted({r["rank"] for r in records})
    why: dict[int, list[str]] = {}
    shown = records
    if not every_rank and len(ranks) > BAND_PAST:
        why = extreme_ranks(records)
        shown = [rec for rec in records if rec["rank"] in why]
        ranks = list(why)
    names = {r: f"rank {r}" + (f" ({', '.join(why[r])})" if r in why else "") for r in ranks}
    lanes = [lane for r in ranks for lane in (names[r], f"{names[r]} comm")]
    bars: dict[tuple[str, bool], dict] = {}
    comm_kinds: list[str] = []
    for rec in shown:
        t0 = (rec["wall_start"] - origin) * 1e3
        for s in rec["spans"]:
            lane = names[rec["rank"]] if s["lane"] == "phase" else f"{names[rec['rank']]} comm"
            if s["lane"] == "comm" and s["name"] not in comm_kinds:
                comm_kinds.append(s["name"])
            b = bars.setdefault(
                (s["name"], s["lane"] == "comm" and s["wait"]), {"x": [], "base": [], "y": [], "text": []}
            )
            b["base"].append(t0 + s["start"] * 1e3)
            b["x"].append((s["end"] - s["start"]) * 1e3)
            b["y"].append(lane)
            b["text"].append(
                f"rank {rec['rank']} step {rec['step']}: {s['name']}"
                f"{' (blocked)' if s['wait'] else ''} {(s['end'] - s['start']) * 1e3:.2f} ms"
            )
    fig = go.Figure()
    for (name, blocked), b in bars.items():
        color = (
            PHASE_COLORS.get(name) or COMM_COLORS[comm_kinds.index(name) % len(COMM_COLORS)]
            if name in comm_kinds
            else PHASE_COLORS.get(name, "#888888")
        )
        fig.add_trace(
            go.Bar(
                name=f"{name}{' (blocked)' if blocked else ''}",
                orientation="h",
                x=b["x"],
                base=b["base"],
                y=b["y"],
                hovertext=b["text"],
                hoverinfo="text",
                marker={"color": color, "line": {"width": 0}, "pattern": {"shape": "/" if blocked else ""}},
            )
        )
    # step boundaries, so a late start is visible (set at once: add_shape per step is quadratic)
    lane_at = {lane: i for i, lane in enumerate(lanes)}
    boxes = []
    for rec in shown:
        t0 = (rec["wall_start"] - origin) * 1e3
        y = lane_at[names[rec["rank"]]]
        boxes.append(
            {
                "type": "rect",
                "x0": t0,
                "x1": t0 + rec["duration"] * 1e3,
                "y0": y - 0.45,
                "y1": y + 0.45,
                "line": {"color": "#333", "width": 1},
            }
        )
    fig.update_layout(shapes=boxes)
    late = stragglers(records)
    if late:
        counts = pd.Series(list(late.values())).value_counts()
        unjudged = len({r["step"] for r in records}) - len(late)
        title = (
            f"straggler: rank {counts.index[0]} in {counts.iloc[0]}/{len(late)} steps (the rank the others "
            f"wait for){f'; {unjudged} step(s) not judged, see below' if unjudged else ''}"
        )
    else:
        title = "per-rank step timeline"
    steps = sorted({r["step"] for r in records})
    notes: dict[str, list[tuple[int, int]]] = {}
    for rec in records:
        for note in rec.get("notes", []):
            notes.setdefault(note, []).append((rec["step"], rec["rank"]))
    sub = "".join(
        f"<br><sub>step {', '.join(map(str, sorted({s for s, _ in where})))}, "
        f"rank {_ranks_list(sorted({r for _, r in where}))}: {note}</sub>"
        for note, where in notes.items()
    )
    if why:
        n_all = len({r["rank"] for r in records})
        sub += (
            f"<br><sub>{len(why)} of {n_all} ranks drawn: the {EXTREMES} slowest and {EXTREMES} fastest by time "
            "working (not blocked), and the straggler; every rank: `%distrain timeline --ranks all`</sub>"
        )
    fig.update_layout(
        title=f"steps {steps[0]}-{steps[-1]}: {title}{sub}",
        barmode="overlay",
        bargap=0.25,
        xaxis={"title": "ms from the first step's start"},
        yaxis={"categoryorder": "array", "categoryarray": lanes, "autorange": "reversed"},
        height=max(260, 48 * len(lanes) + 120),
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
        legend={"orientation": "h", "y": -0.2},
    )
    return fig
