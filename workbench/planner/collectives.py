"""Collective bandwidth as nccl-tests reports it (algbw, busbw), and the alpha-beta model.

Pure arithmetic, used on both sides (the ranks time, the notebook fits and checks); the
conventions and their sources are in docs/planner.md ("How each part is counted")."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BUS_FACTOR", "bus_factor", "algbw", "busbw", "AlphaBeta", "fit_alpha_beta"]

# collective -> busbw / algbw as a function of the world size n (nccl-tests PERFORMANCE.md)
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def bus_factor(collective: str, n: int) -> float:
    if collective not in BUS_FACTOR:
        raise ValueError(f"no bus-bandwidth factor for {collective!r}; known: {sorted(BUS_FACTOR)}")
    if n < 1:
        raise ValueError(f"world size must be 1 or more, got {n}")
    return BUS_FACTOR[collective](n)


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth, bytes/s: the buffer size over the time."""
    return nbytes / seconds


def busbw(collective: str, n: int, nbytes: float, seconds: float) -> float:
    """Bus bandwidth, bytes/s: algbw times the collective's factor at n ranks."""
    return algbw(nbytes, seconds) * bus_factor(collective, n)


@dataclass(frozen=True)
class AlphaBeta:
    """``t(S) = alpha + S / bandwidth`` (seconds, bytes, bytes/s) and how well it fits."""

    alpha: float  # seconds: the latency of an empty message
    bandwidth: float  # bytes/s: 1 / the slope
    r2: float  # coefficient of determination of the fit on the points given

    def seconds(self, nbytes: float) -> float:
        return self.alpha + nbytes / self.bandwidth


def fit_alpha_beta(sizes: list[float], seconds: list[float]) -> AlphaBeta:
    """Least-squares line through (bytes, seconds), weighted by 1/t so that the small
    messages (where alpha shows) count as much as the large ones (where beta shows)."""
    if len(sizes) != len(seconds) or len(sizes) < 2:
        raise ValueError("fit_alpha_beta needs at least two (size, seconds) points of equal count")
    w = [1.0 / (t * t) for t in seconds]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, sizes)) / sw
    my = sum(wi * y for wi, y in zip(w, seconds)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, sizes))
    sxy = sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, sizes, seconds))
    if sxx == 0:
        raise ValueError("fit_alpha_beta needs at least two different sizes")
    slope = sxy / sxx
    alpha = my - slope * mx
    if slope <= 0:
        raise ValueError(
            f"time does not grow with size (slope {slope:.3g} s/B): the run is "
            "dominated by noise; use larger sizes or more iterations"
        )
    pred = [alpha + slope * x for x in sizes]
    ss_res = sum(wi * (y - p) ** 2 for wi, y, p in zip(w, seconds, pred))
    ss_tot = sum(wi * (y - my) ** 2 for wi, y in zip(w, seconds))
    return AlphaBeta(alpha=alpha, bandwidth=1.0 / slope, r2=1.0 - ss_res / ss_tot if ss_tot else 1.0)
