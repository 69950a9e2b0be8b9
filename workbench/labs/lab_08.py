"""Checks of lab 08 (collectives and bandwidth): each compares the student's number with
one computed from the run's own measurements and names the likely mistake."""

from __future__ import annotations

import math

from workbench.labs.checking import CheckFailed, checker
from workbench.planner.collectives import algbw, bus_factor, busbw

__all__ = ["check_busbw", "check_alpha_beta", "check_ring", "check_ring_bytes"]


def _number(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CheckFailed(f"expected {what} as a finite number, got {value!r}: replace the `...` with your formula")
    return float(value)


def _close(a: float, b: float, rel: float = 1e-6) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b))


def _scale_hint(value: float, want: float, unit: str) -> str | None:
    """A power-of-1000 slip (kB/MB/GB, ms/us) between the answer and the measurement."""
    for k, name in ((1e3, "10^3"), (1e6, "10^6"), (1e9, "10^9")):
        if _close(value, want * k, 1e-3) or _close(value, want / k, 1e-3):
            return (
                f"off by a factor of {name}: keep {unit} (bytes and seconds as measured, no kB/MB/GB "
                f"or ms) - expected {want:.4g}, got {value:.4g}"
            )
    return None


@checker("lab_08.busbw")
def check_busbw(value, *, collective: str, ranks: int, nbytes: float, seconds: float) -> None:
    """The bus bandwidth of one measured point (bytes/s)."""
    got = _number(value, "the bus bandwidth in bytes/s")
    want = busbw(collective, ranks, nbytes, seconds)
    if _close(got, want):
        return f"{collective} busbw {got / 1e9:.3f} GB/s = algbw x {bus_factor(collective, ranks):.3g} on {ranks} ranks"
    alg = algbw(nbytes, seconds)
    f = bus_factor(collective, ranks)
    if _close(got, alg) and f != 1:
        raise CheckFailed(
            f"that is the algorithm bandwidth S/t = {alg:.4g} B/s; the bus bandwidth multiplies it by "
            f"the collective's factor ({f:.3g} for {collective} on {ranks} ranks, nccl-tests "
            "PERFORMANCE.md)"
        )
    if collective == "all_reduce" and _close(got, alg * (ranks - 1) / ranks):
        raise CheckFailed(
            "you used (n-1)/n, the factor of reduce-scatter or all-gather; a ring all-reduce is a "
            "reduce-scatter AND an all-gather, so its factor is 2(n-1)/n"
        )
    if collective == "all_reduce" and _close(got, alg * 2):
        raise CheckFailed("you used 2, the limit of 2(n-1)/n for many ranks; with n ranks the factor is 2(n-1)/n")
    for k in (ranks, 1 / ranks):
        if _close(got, want * k):
            raise CheckFailed(
                f"off by a factor of the world size ({ranks}): expected {want:.4g} B/s, got {got:.4g}; "
                "S is the whole buffer, not one rank's share, and the factor is per rank"
            )
    if _close(got, alg / f) and f != 1:
        raise CheckFailed(f"you divided by the factor {f:.3g}; busbw = algbw x factor")
    raise CheckFailed(
        _scale_hint(got, want, "bytes/s") or f"expected {want:.4g} B/s (busbw = S/t x factor), got {got:.4g}"
    )


@checker("lab_08.alpha_beta")
def check_alpha_beta(value, *, alpha: float, bandwidth: float, nbytes: float) -> None:
    """Predicted seconds for ``nbytes`` under the fitted ``t = alpha + S / bandwidth``."""
    got = _number(value, "the predicted time in seconds")
    want = alpha + nbytes / bandwidth
    if _close(got, want):
        return f"alpha + S / bandwidth = {got * 1e3:.3f} ms for {nbytes:,.0f} bytes"
    if _close(got, nbytes / bandwidth):
        raise CheckFailed(f"you left out alpha ({alpha * 1e6:.1f} us), the fixed latency every message pays")
    if _close(got, alpha):
        raise CheckFailed("that is alpha alone; add the transfer time S / bandwidth")
    if _close(got, alpha + nbytes * bandwidth):
        raise CheckFailed("you multiplied by the bandwidth; the transfer time is S / bandwidth (bytes over bytes/s)")
    raise CheckFailed(
        _scale_hint(got, want, "seconds") or f"expected {want:.4g} s (alpha + S / bandwidth), got {got:.4g}"
    )


def _max_diff(a, b) -> float:
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


@checker("lab_08.ring")
def check_ring(value, *, reference, inputs, tol: float = 1e-5) -> None:
    """Every rank's hand-written ring all-reduce (one list per rank) against ``dist.all_reduce``'s
    sum (``reference``, per rank); ``inputs`` are the ranks' inputs."""
    if not isinstance(value, (list, tuple)) or not value or not isinstance(value[0], (list, tuple)):
        raise CheckFailed(
            f"expected one list of values per rank (workbench.pull of your result), got {type(value).__name__}"
        )
    n = len(inputs)
    if len(value) != n or any(len(v) != len(reference[r]) for r, v in enumerate(value)):
        raise CheckFailed(
            f"expected {n} results of {len(reference[0])} values, got "
            f"{len(value)} of {[len(v) for v in value]}: return the whole buffer, not one chunk"
        )
    worst = max(_max_diff(v, reference[r]) for r, v in enumerate(value))
    if worst <= tol:
        return f"the ring all-reduce equals dist.all_reduce on all {n} ranks (max diff {worst:.1e} <= {tol:g})"
    if all(_max_diff(v, inputs[r]) <= tol for r, v in enumerate(value)):
        raise CheckFailed(
            "every rank still holds its own input: nothing was added; in the reduce-scatter steps "
            "add the received chunk into yours"
        )
    if all(_max_diff(v, [x / n for x in reference[r]]) <= tol for r, v in enumerate(value)):
        raise CheckFailed(f"your result is the mean (sum / {n}); dist.all_reduce's default op is SUM")
    size = len(reference[0]) // n
    right = [
        [_max_diff(v[c * size : (c + 1) * size], reference[r][c * size : (c + 1) * size]) <= tol for c in range(n)]
        for r, v in enumerate(value)
    ]
    if all(sum(row) == 1 for row in right):
        owned = [row.index(True) for row in right]
        raise CheckFailed(
            f"each rank has exactly one fully reduced chunk (rank r: chunk {owned}): the reduce-scatter "
            "works; the all-gather phase (n-1 more steps passing the reduced chunks on) is missing"
        )
    if any(any(row) for row in right):
        raise CheckFailed(
            "some chunks are right and others not: check which chunk index each step sends "
            "((rank - step) % n) and receives ((rank - step - 1) % n)"
        )
    raise CheckFailed(
        f"max |ring - all_reduce| = {worst:.3g}, above {tol:g}: compare your chunk indices and the "
        "number of steps (n-1 per phase) with the picture above"
    )


@checker("lab_08.ring_bytes")
def check_ring_bytes(value, *, sent: int, ranks: int, nbytes: int) -> None:
    """Bytes one rank sent in the hand-written ring (``sent``, counted as it ran) vs the formula."""
    got = _number(value, "the bytes one rank sends")
    if got != sent:
        if got == nbytes:
            raise CheckFailed(
                f"that is the buffer B = {nbytes:,}; a rank sends 2(n-1)/n x B = {sent:,} "
                f"(n-1 chunks of B/n in each of the two phases)"
            )
        if got == 2 * nbytes:
            raise CheckFailed("2B is the limit for many ranks; with n ranks it is 2(n-1)/n x B")
        if got == (ranks - 1) / ranks * nbytes:
            raise CheckFailed("(n-1)/n x B is one phase (reduce-scatter); the all-gather sends as much again")
        raise CheckFailed(f"your ring sent {sent:,} bytes per rank; your formula gives {got:,.0f}")
    if sent != 2 * (ranks - 1) * nbytes // ranks:
        raise CheckFailed(
            f"your formula matches what your ring sent ({sent:,} bytes), but a ring all-reduce sends "
            f"2(n-1)/n x B = {2 * (ranks - 1) * nbytes // ranks:,}: the ring sends too much or too little"
        )
    return f"a ring all-reduce of {nbytes:,} bytes sends 2(n-1)/n x B = {sent:,} bytes per rank on {ranks} ranks"
