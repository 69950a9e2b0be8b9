"""A picture of a layout: which shard of which tensor lives on which rank.

Input is the per-rank layout description (``workbench.strategies.layout``), pulled from the
ranks; nothing here touches torch. Two views: :func:`layout_figure` (tensors x ranks) and
:func:`tensor_figure` (one tensor as a grid of the blocks each rank holds). Both draw what each
rank reported holding (the layout's ``holds``: global index runs asked of the DTensor /
DeepSpeed partition on the rank), never placement arithmetic redone here, which gets strided
FSDP x TP shards wrong.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

import pandas as pd

from .bands import BAND_PAST


def layout_table(layouts: list[dict]) -> pd.DataFrame:
    """One row per (tensor, rank): placements, shapes, bytes, fraction held, and how
    (``whole``, ``shard``, ``N blocks`` for a non-contiguous shard, ``partial sum``)."""
    rows = []
    for lay in layouts:
        for p in lay["params"]:
            blocks = held_blocks(p)
            fraction = held_fraction(p)
            if p["holds"].get("partial"):
                how = "partial sum"
            elif fraction == 1:
                how = "whole"
            else:
                how = "shard" if len(blocks) <= 1 else f"{len(blocks)} blocks"
            rows.append(
                {
                    "tensor": p["name"],
                    "rank": lay["rank"],
                    "placements": ", ".join(p["placements"]),
                    "global_shape": tuple(p["global_shape"]),
                    "local_shape": tuple(p["local_shape"]),
                    "local_bytes": p["local_bytes"],
                    "fraction": fraction,
                    "holding": how,
                }
            )
    return pd.DataFrame(rows)


def _pick(table: pd.DataFrame, max_tensors: int, match: str | None) -> list[str]:
    names = list(dict.fromkeys(table["tensor"]))
    if match:
        names = [n for n in names if re.search(match, n)]
    if len(names) <= max_tensors:
        return names
    # the largest tensors tell the story; keep model order among them
    size = table.groupby("tensor")["local_bytes"].sum()
    keep = set(size.loc[names].nlargest(max_tensors).index)
    return [n for n in names if n in keep]


def _ranks_text(ranks: list[int]) -> str:
    from ...shared.ranges import format_ranks

    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def rank_groups(layouts: list[dict]) -> list[dict]:
    """Ranks whose column of the layout picture is the same, first rank first.

    Each group: ``ranks``, ``label`` (``ranks 0-31``), ``shards`` (how many different sets of
    blocks its ranks hold: 1 for replicas, ``len(ranks)`` when each holds its own shard) and
    ``summary``, a line such as "ranks 0-31 hold the whole model (32 replicas)".
    """
    columns: dict[tuple, list[int]] = {}
    blocks: dict[int, tuple] = {}
    whole: dict[int, bool] = {}
    share: dict[int, set] = {}
    for lay in sorted(layouts, key=lambda lay: lay["rank"]):
        r = lay["rank"]
        key = []
        held = []
        share[r] = set()
        for p in lay["params"]:
            fraction = held_fraction(p)
            partial = bool(p["holds"].get("partial"))
            key.append((p["name"], fraction, partial, tuple(p["local_shape"]), tuple(p["placements"])))
            held.append((p["name"], tuple(held_blocks(p)), partial))
            share[r].add(Fraction(fraction).limit_denominator(1 << 20))
        columns.setdefault(tuple(key), []).append(r)
        blocks[r] = tuple(held)
        whole[r] = all(f == 1 for f in share[r])
    out = []
    for ranks in columns.values():
        label = _ranks_text(ranks)
        shards = len({blocks[r] for r in ranks})
        n = len(ranks)
        if whole[ranks[0]]:
            summary = f"{label} hold the whole model" + (f" ({n} replicas)" if n > 1 else "")
        else:
            fractions = share[ranks[0]]
            what = f"{next(iter(fractions))} of every tensor" if len(fractions) == 1 else "a part of each tensor"
            if n == 1:
                summary = f"{label} holds {what}"
            elif shards == 1:
                summary = f"{label} hold the same blocks, {what} ({n} replicas)"
            elif shards == n:
                summary = f"{label} hold {what}, each a different shard"
            else:
                summary = f"{label} hold {what}: {shards} different shards, each on {n // shards} ranks"
        out.append({"ranks": ranks, "label": label, "shards": shards, "summary": summary})
    return sorted(out, key=lambda g: g["ranks"][0])


def layout_figure(layouts: list[dict], *, max_tensors: int = 24, match: str | None = None):
    """Heatmap of the fraction of each tensor held by each rank, with how it is held (whole, shard,
    several strided blocks, partial sum), the placement and local shape on hover: DDP is a solid
    block (everyone holds everything), FSDP a 1/N wash, TP a split by layer type, 2D both at once.

    Past ``BAND_PAST`` ranks, a column per group of ranks whose columns would be the same (same
    share, holding and local shape of every tensor: :func:`rank_groups`): DDP's 1024 replicas are
    one column, "ranks 0-1023", FSDP's 1024 shards one column that says they are 1024 different
    shards; the title says per group whether its ranks hold the same blocks."""
    import plotly.graph_objects as go

    table = layout_table(layouts)
    names = _pick(table, max_tensors, match)
    ranks = sorted({lay["rank"] for lay in layouts})
    groups = rank_groups(layouts) if len(ranks) > BAND_PAST else None
    columns = [(g["ranks"][0], g["label"], g) for g in groups] if groups else [(r, f"rank {r}", None) for r in ranks]
    sub = table[table["tensor"].isin(names)].set_index(["tensor", "rank"])
    z, text, cell = [], [], []
    for name in names:
        cell.append([_cell_label(sub.loc[(name, r)]) if (name, r) in sub.index else "" for r, _, _ in columns])
        z.append([float(sub.loc[(name, r), "fraction"]) if (name, r) in sub.index else 0.0 for r, _, _ in columns])
        text.append(
            [
                f"{name}<br>{label}: {sub.loc[(name, r), 'local_shape']} of {sub.loc[(name, r), 'global_shape']}"
                f" ({sub.loc[(name, r), 'holding']}, {100 * sub.loc[(name, r), 'fraction']:.1f}%)"
                f"<br>{sub.loc[(name, r), 'placements']}" + (f"<br>{g['summary']}" if g else "")
                if (name, r) in sub.index
                else f"{name}<br>{label}: not held"
                for r, label, g in columns
            ]
        )
    lay0 = layouts[0]
    mesh = " x ".join(f"{n}={s}" for n, s in zip(lay0["mesh"]["dim_names"], lay0["mesh"]["shape"]))
    grouped = "".join(f"<br><sub>{g['summary']}</sub>" for g in groups[:6]) if groups else ""
    if groups and len(groups) > 6:
        grouped += f"<br><sub>... and {len(groups) - 6} more groups of ranks</sub>"
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[label for _, label, _ in columns],
            y=names,
            hovertext=text,
            hoverinfo="text",
            text=cell,
            texttemplate="%{text}",
            zmin=0,
            zmax=1,
            colorscale="Blues",
            colorbar={"title": "share held"},
        )
    )
    fig.update_layout(
        title=f"{lay0['strategy']} ({lay0['path']} path) on mesh {mesh}: share of each tensor per "
        + ("group of ranks" if groups else "rank")
        + grouped,
        yaxis={"autorange": "reversed"},
        height=max(300, 22 * len(names) + 120) + (18 * min(len(groups), 7) if groups else 0),
        margin={"l": 10, "r": 10, "t": 50 + (18 * min(len(groups), 7) if groups else 0), "b": 10},
    )
    return fig


def _cell_label(row) -> str:
    """What a heatmap cell says: ``all``, a share like ``1/4``, ``+2 blk`` for strided, ``Σ`` for partial."""
    if row["holding"] == "partial sum":
        return "Σ partial"
    if row["holding"] == "whole":
        return "all"
    share = Fraction(float(row["fraction"])).limit_denominator(4096)
    label = f"{share.numerator}/{share.denominator}"
    return label if row["holding"] == "shard" else f"{label} in {row['holding']}"


def _flat_runs(runs: list[list[list[int]]], shape: list[int]) -> list[tuple[int, int]]:
    """Index runs per dim -> runs of row-major flat indices over those dims."""
    if not shape:
        return [(0, 1)]
    inner_shape = shape[1:]
    stride = math.prod(inner_shape) if inner_shape else 1
    inner = _flat_runs(runs[1:], inner_shape) if inner_shape else [(0, 1)]
    whole_inner = inner == [(0, stride)]
    out: list[tuple[int, int]] = []

    def add(a: int, b: int) -> None:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))

    for a, b in runs[0]:
        if whole_inner:
            add(a * stride, b * stride)
            continue
        for i in range(a, b):
            for ia, ib in inner:
                add(i * stride + ia, i * stride + ib)
    return out


def grid_shape(shape: list[int]) -> tuple[int, int]:
    """A tensor drawn as rows (dim 0) x columns (all later dims, flattened row-major)."""
    return (shape[0] if shape else 1), (math.prod(shape[1:]) if len(shape) > 1 else 1)


def _flat_to_rects(a: int, b: int, cols: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """A range of the flattened tensor as the (up to three) rectangles it covers on the grid."""
    rects = []
    r0, c0 = divmod(a, cols)
    r1, c1 = divmod(b, cols)
    if r0 == r1:
        return [((r0, r0 + 1), (c0, c1))] if c1 > c0 else []
    if c0:
        rects.append(((r0, r0 + 1), (c0, cols)))
        r0 += 1
    if r1 > r0:
        rects.append(((r0, r1), (0, cols)))
    if c1:
        rects.append(((r1, r1 + 1), (0, c1)))
    return rects


def held_blocks(param: dict) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The rectangles ``((row start, stop), (col start, stop))`` of the tensor's grid that
    this rank holds, from what the rank reported holding (``holds``), never from placement
    names: a strided shard comes back as the several blocks it is."""
    holds = param.get("holds")
    if holds is None:
        raise ValueError(
            f"{param['name']}: this layout does not say what each rank holds (made by an older "
            "workbench); prepare the model again to draw it"
        )
    shape = list(param["global_shape"])
    rows, cols = grid_shape(shape)
    if holds["kind"] == "flat":
        return [rect for a, b in holds["runs"] for rect in _flat_to_rects(a, b, cols)]
    runs = holds["runs"]
    if not shape:
        return [((0, 1), (0, 1))]
    col_runs = _flat_runs(runs[1:], shape[1:]) if len(shape) > 1 else [(0, 1)]
    return [((a, b), (c, d)) for a, b in runs[0] for c, d in col_runs if b > a and d > c]


def held_fraction(param: dict) -> float:
    """Share of the tensor's elements this rank holds, counted from its blocks."""
    rows, cols = grid_shape(list(param["global_shape"]))
    held = sum((b - a) * (d - c) for (a, b), (c, d) in held_blocks(param))
    return held / ((rows * cols) or 1)


def tensor_blocks(layouts: list[dict], name: str) -> tuple[list[int], list[str], dict]:
    """(global shape, placements, {(row span, col span): [ranks holding that block]})."""
    entries = [(lay, p) for lay in layouts for p in lay["params"] if p["name"] == name]
    if not entries:
        known = ", ".join(p["name"] for p in layouts[0]["params"][:8])
        raise KeyError(f"no tensor named {name!r} in the layout; some names: {known}, ...")
    blocks: dict[tuple, list[int]] = {}
    for lay, p in entries:
        for key in held_blocks(p):
            blocks.setdefault(key, []).append(lay["rank"])
    first = entries[0][1]
    return list(first["global_shape"]), list(first["placements"]), dict(sorted(blocks.items()))


def _partial_ranks(layouts: list[dict], name: str) -> set[int]:
    return {
        lay["rank"]
        for lay in layouts
        for p in lay["params"]
        if p["name"] == name and (p.get("holds") or {}).get("partial")
    }


def tensor_figure(layouts: list[dict], name: str):
    """Draw one tensor as its (rows x cols) grid, each block labelled with the ranks that hold it:
    the "which slice of which weight" view."""
    import plotly.graph_objects as go

    shape, placements, blocks = tensor_blocks(layouts, name)
    rows, cols = grid_shape(shape)
    partial = _partial_ranks(layouts, name)
    per_rank = {r: sum(1 for rs in blocks.values() if r in rs) for rs in blocks.values() for r in rs}
    fig = go.Figure()
    palette = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6"]
    rects, labels = [], []  # set at once: add_shape / add_annotation per block is quadratic
    for i, ((rspan, cspan), ranks) in enumerate(blocks.items()):
        label = _ranks_text(sorted(ranks))
        if partial & set(ranks):
            label += " (partial sum)"
        rects.append(
            {
                "type": "rect",
                "x0": cspan[0],
                "x1": cspan[1],
                "y0": rspan[0],
                "y1": rspan[1],
                "fillcolor": palette[i % len(palette)],
                "opacity": 0.75,
                "line": {"color": "white", "width": 2},
            }
        )
        labels.append(
            {
                "x": (cspan[0] + cspan[1]) / 2,
                "y": (rspan[0] + rspan[1]) / 2,
                "text": label,
                "showarrow": False,
                "font": {"color": "white"},
            }
        )
    fig.update_layout(shapes=rects, annotations=labels)
    split = sorted(r for r, n in per_rank.items() if n > 1)
    fig.update_xaxes(
        range=[0, cols], title=("dim 1" if len(shape) == 2 else "dims 1.. flattened") if len(shape) > 1 else ""
    )
    fig.update_yaxes(range=[rows, 0], title="dim 0")
    note = f"<br><sub>non-contiguous: rank(s) {', '.join(map(str, split))} hold several blocks</sub>" if split else ""
    fig.update_layout(
        title=f"{name} {tuple(shape)}: {', '.join(placements)}{note}",
        height=420,
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig
