"""A picture of a layout: which shard of which tensor lives on which rank.

Input is the per-rank LAYOUT DESCRIPTION (``workbench.strategies.layout``), pulled
from the ranks; nothing here touches torch. Two views:

* :func:`layout_figure` - tensors x ranks, coloured by the fraction of the tensor the
  rank holds, with the placement and local shape on hover. DDP is a solid block
  (everyone holds everything), FSDP a diagonal-free 1/N wash, TP a split by layer
  type, 2D both at once.
* :func:`tensor_figure` - one tensor drawn as its (rows x cols) grid, each block
  labelled with the ranks that hold it, derived from DTensor placements and the
  rank's mesh coordinate - the "which slice of which weight" view for a lab.
"""
from __future__ import annotations

import math
import re

import pandas as pd

_SHARD = re.compile(r"(?:_?Strided)?Shard\((?:dim=)?(\d+)")


def layout_table(layouts: list[dict]) -> pd.DataFrame:
    """One row per (tensor, rank): placements, shapes, bytes and fraction held."""
    rows = []
    for lay in layouts:
        for p in lay["params"]:
            glob = math.prod(p["global_shape"]) or 1
            rows.append({
                "tensor": p["name"],
                "rank": lay["rank"],
                "placements": ", ".join(p["placements"]),
                "global_shape": tuple(p["global_shape"]),
                "local_shape": tuple(p["local_shape"]),
                "local_bytes": p["local_bytes"],
                "fraction": math.prod(p["local_shape"]) / glob,
            })
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


def layout_figure(layouts: list[dict], *, max_tensors: int = 24, match: str | None = None):
    """Heatmap of the fraction of each tensor held by each rank."""
    import plotly.graph_objects as go

    table = layout_table(layouts)
    names = _pick(table, max_tensors, match)
    ranks = sorted({lay["rank"] for lay in layouts})
    sub = table[table["tensor"].isin(names)].set_index(["tensor", "rank"])
    z, text = [], []
    for name in names:
        z.append([float(sub.loc[(name, r), "fraction"]) if (name, r) in sub.index else 0.0 for r in ranks])
        text.append([
            f"{name}<br>rank {r}: {sub.loc[(name, r), 'local_shape']} of {sub.loc[(name, r), 'global_shape']}"
            f"<br>{sub.loc[(name, r), 'placements']}" if (name, r) in sub.index else f"{name}<br>rank {r}: -"
            for r in ranks
        ])
    lay0 = layouts[0]
    mesh = " x ".join(f"{n}={s}" for n, s in zip(lay0["mesh"]["dim_names"], lay0["mesh"]["shape"]))
    fig = go.Figure(go.Heatmap(
        z=z, x=[f"rank {r}" for r in ranks], y=names, text=text, hoverinfo="text",
        zmin=0, zmax=1, colorscale="Blues", colorbar={"title": "share held"},
    ))
    fig.update_layout(
        title=f"{lay0['strategy']} ({lay0['path']} path) on mesh {mesh}: share of each tensor per rank",
        yaxis={"autorange": "reversed"}, height=max(300, 22 * len(names) + 120),
        margin={"l": 10, "r": 10, "t": 50, "b": 10},
    )
    return fig


def mesh_coordinate(rank: int, shape: list[int]) -> list[int]:
    """Row-major coordinate of ``rank`` in a mesh of ``shape`` (init_device_mesh's order)."""
    coord = []
    for size in reversed(shape):
        coord.append(rank % size)
        rank //= size
    return list(reversed(coord))


def owned_block(layout: dict, param: dict) -> list[tuple[int, int]]:
    """[(start, stop)] per tensor dim that this rank holds, from its placements.

    Several mesh dims sharding the same tensor dim split it in mesh-dim order
    (strided FSDP x TP shards are drawn in that simplified order).
    """
    shape = list(param["global_shape"])
    spans = [(0, s) for s in shape]
    coord = mesh_coordinate(layout["rank"], layout["mesh"]["shape"]) if layout["mesh"]["shape"] else []
    for i, placement in enumerate(param["placements"]):
        m = _SHARD.match(placement)
        if not m or i >= len(coord):
            continue
        dim = int(m.group(1))
        lo, hi = spans[dim]
        n = layout["mesh"]["shape"][i]
        chunk = math.ceil((hi - lo) / n)
        start = min(hi, lo + coord[i] * chunk)
        spans[dim] = (start, min(hi, start + chunk))
    return spans


def tensor_blocks(layouts: list[dict], name: str) -> tuple[list[int], list[str], dict]:
    """(global shape, placements, {(row span, col span): [ranks holding that block]})."""
    entries = [(lay, p) for lay in layouts for p in lay["params"] if p["name"] == name]
    if not entries:
        known = ", ".join(p["name"] for p in layouts[0]["params"][:8])
        raise KeyError(f"no tensor named {name!r} in the layout; some names: {known}, ...")
    blocks: dict[tuple, list[int]] = {}
    for lay, p in entries:
        spans = owned_block(lay, p)
        key = (spans[0], spans[1] if len(spans) > 1 else (0, 1))
        blocks.setdefault(key, []).append(lay["rank"])
    first = entries[0][1]
    return list(first["global_shape"]), list(first["placements"]), dict(sorted(blocks.items()))


def tensor_figure(layouts: list[dict], name: str):
    """Draw one tensor as a grid and mark which ranks hold each block."""
    import plotly.graph_objects as go

    shape, placements, blocks = tensor_blocks(layouts, name)
    rows, cols = shape[0], shape[1] if len(shape) > 1 else 1
    fig = go.Figure()
    palette = ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6"]
    for i, ((rspan, cspan), ranks) in enumerate(blocks.items()):
        label = "ranks " + ",".join(map(str, sorted(ranks))) if len(ranks) > 1 else f"rank {ranks[0]}"
        fig.add_shape(type="rect", x0=cspan[0], x1=cspan[1], y0=rspan[0], y1=rspan[1],
                      fillcolor=palette[i % len(palette)], opacity=0.75, line={"color": "white", "width": 2})
        fig.add_annotation(x=(cspan[0] + cspan[1]) / 2, y=(rspan[0] + rspan[1]) / 2, text=label,
                           showarrow=False, font={"color": "white"})
    fig.update_xaxes(range=[0, cols], title="dim 1" if len(shape) > 1 else "")
    fig.update_yaxes(range=[rows, 0], title="dim 0")
    fig.update_layout(title=f"{name} {tuple(shape)}: {', '.join(placements)}",
                      height=420, margin={"l": 10, "r": 10, "t": 50, "b": 10})
    return fig
