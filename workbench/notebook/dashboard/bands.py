"""Per-rank lines that still read at hundreds of ranks: a min-max band, the median, the outliers.

A panel with a line per rank is a tangle past a few dozen ranks (and 1024 traces are slow to
draw), so past ``BAND_PAST`` ranks a per-rank panel draws three lines over the ranks (min,
median, max, the space between min and max filled) and the ``OUTLIERS`` ranks that stray
furthest from the median as lines of their own, named by rank. Their trace slots are fixed
("outlier 1".."outlier k") so that a redraw restyles them instead of adding traces as the
outliers change; the rank a slot shows is its label.
"""

from __future__ import annotations

BAND_PAST = 16  # rank sets larger than this draw bands instead of a line per rank
OUTLIERS = 3
BAND_COLOR = "rgba(31,119,180,0.18)"


def banded(n_ranks: int) -> bool:
    return n_ranks > BAND_PAST


def common_steps(lines: list[tuple]):
    """(steps every line has, ranks x steps matrix of their values); a step reported twice
    counts once (its first value)."""
    import numpy as np

    first_xs = lines[0][0]
    if all(len(xs) == len(first_xs) for xs, _ in lines):  # the usual case: every rank at the same steps
        xs_all = np.stack([xs for xs, _ in lines])
        if (xs_all == first_xs).all() and (len(first_xs) < 2 or (np.diff(first_xs) > 0).all()):
            return first_xs, np.stack([ys for _, ys in lines])
    lines = [(xs[first], ys[first]) for xs, ys in lines for _, first in [np.unique(xs, return_index=True)]]
    common = lines[0][0]
    for xs, _ in lines[1:]:
        common = np.intersect1d(common, xs, assume_unique=True)
    matrix = np.empty((len(lines), len(common)))
    for i, (xs, ys) in enumerate(lines):
        matrix[i] = ys[np.searchsorted(xs, common)]
    return common, matrix


def outliers(matrix, k: int = OUTLIERS) -> list[int]:
    """Row indices of the ``k`` rows furthest from the median row (mean absolute distance,
    NaN counted as furthest), most outlying first; none when every row is the median."""
    import numpy as np

    if matrix.size == 0:
        return []
    with np.errstate(all="ignore"):
        median = np.nanmedian(matrix, axis=0)
        dist = np.abs(matrix - median)
        dist[np.isnan(dist)] = np.inf
        score = dist.mean(axis=1)
    order = [int(i) for i in np.argsort(-score, kind="stable")[:k]]
    return [i for i in order if score[i] > 0]


def band_traces(lines: list[tuple], ranks: list[int], *, scale: float = 1.0, k: int = OUTLIERS) -> list[tuple]:
    """[(name, xs, ys, style)] for a panel: min, max (filled to min), median, outlier slots.

    ``lines``: (xs, ys) per rank of ``ranks`` (empty ones are left out). Slots with no outlier
    this time are given empty data, so a rank that stopped straying stops being drawn.
    """
    import numpy as np

    have = [(r, line) for r, line in zip(ranks, lines) if len(line[0])]
    if not have:
        return []
    steps, matrix = common_steps([line for _, line in have])
    matrix = matrix / scale
    with np.errstate(all="ignore"):
        lo, mid, hi = np.nanmin(matrix, axis=0), np.nanmedian(matrix, axis=0), np.nanmax(matrix, axis=0)
    out = [
        ("min", steps, lo, {"width": 0.5, "color": BAND_COLOR}),
        ("max", steps, hi, {"width": 0.5, "color": BAND_COLOR, "fill": "tonexty", "fillcolor": BAND_COLOR}),
        ("median", steps, mid, {"width": 2, "color": "rgb(31,119,180)"}),
    ]
    picked = outliers(matrix, k)
    for slot in range(k):
        if slot < len(picked):
            rank, (xs, ys) = have[picked[slot]]
            out.append((f"outlier {slot + 1}", xs, ys / scale, {"width": 1, "label": f"rank {rank}"}))
        else:
            out.append((f"outlier {slot + 1}", np.empty(0), np.empty(0), {"width": 1, "label": f"outlier {slot + 1}"}))
    return out


def band_names(k: int = OUTLIERS) -> list[tuple]:
    """The traces a banded panel has from the start (empty), in drawing order."""
    return [
        ("min", {"width": 0.5, "color": BAND_COLOR}),
        ("max", {"width": 0.5, "color": BAND_COLOR, "fill": "tonexty", "fillcolor": BAND_COLOR}),
        ("median", {"width": 2, "color": "rgb(31,119,180)"}),
        *((f"outlier {i + 1}", {"width": 1}) for i in range(k)),
    ]


MAP_ROWS = 128  # a rank x step heatmap has at most this many rows (bins of ranks) ...
MAP_COLUMNS = 200  # ... and columns (bins of steps), whatever the rank count and run length


def _bin_edges(n: int, most: int) -> list[int]:
    """Starts of ``ceil(n / per)`` equal bins of ``per`` items (the last may be short), so
    that there are at most ``most`` bins."""
    per = max(1, -(-n // most))
    return list(range(0, n, per))


def heatmap(lines: list[tuple], ranks: list[int], *, scale: float = 1.0):
    """(step bins, rank bins, bins matrix, hover labels) of one metric, or None when no rank has it.

    Bounded: at most ``MAP_ROWS`` x ``MAP_COLUMNS`` cells, whatever the rank count and run
    length. A step bin is the mean of its steps; a rank bin shows, per step bin, the value of
    its rank furthest from that step's median over all ranks, so one slow (or NaN) rank among
    eight still colours its cell (a mean would hide it). ``ranks``' bins are labelled by the
    first rank of each; the labels name the whole bin (``ranks 8-15``).
    """
    import numpy as np

    have = [(r, line) for r, line in zip(ranks, lines) if len(line[0])]
    if not have:
        return None
    steps, matrix = common_steps([line for _, line in have])
    if not len(steps):
        return None
    matrix = matrix / scale
    # steps: the mean of each bin of columns (NaN stays NaN: a rank with a NaN step shows it)
    starts = _bin_edges(len(steps), MAP_COLUMNS)
    cols = np.add.reduceat(matrix, starts, axis=1) / np.diff([*starts, len(steps)])
    step_bins = steps[starts]
    # ranks: in each bin the value furthest from the median of its step bin
    with np.errstate(all="ignore"):
        median = np.nanmedian(cols, axis=0)
        dist = np.abs(cols - median)
    dist[np.isnan(dist)] = np.inf
    row_starts = _bin_edges(len(have), MAP_ROWS)
    out = np.empty((len(row_starts), cols.shape[1]))
    labels = []
    bounds = [*row_starts, len(have)]
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        pick = a + np.argmax(dist[a:b], axis=0)
        out[i] = cols[pick, np.arange(cols.shape[1])]
        lo, hi = have[a][0], have[b - 1][0]
        if a == b - 1:
            labels.append(f"rank {lo}")
        else:  # ranks without data are left out of the bins: then say how many it holds
            labels.append(f"ranks {lo}-{hi}" if hi - lo + 1 == b - a else f"{b - a} ranks of {lo}-{hi}")
    return step_bins, [have[a][0] for a in row_starts], out, labels
