"""What is off between a student's number and the measured one, in words (notebook side).

Checkers call :func:`mismatch` with the mistakes a student is likely to make for that
answer (``(ratio, why)``: counted elements instead of bytes is a ratio of 1/4 for fp32);
the generic ones (wrong sign, a factor of the world size, orders of magnitude) follow.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

Mistake = tuple[float, str]  # (student value / measured value, what the student likely did)


def close(a: float, b: float, rtol: float = 1e-2, atol: float = 0.0) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=atol)


def number(value: float) -> str:
    """A number the way the labs print them: thousands separators for integers, 4 digits otherwise."""
    if isinstance(value, bool):
        return str(value)
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.4g}"


def mismatch(
    value: float,
    expected: float,
    *,
    what: str,
    mistakes: Iterable[Mistake] = (),
    world_size: int | None = None,
    rtol: float = 1e-2,
    atol: float = 0.0,
) -> str | None:
    """None when ``value`` matches ``expected`` (the measured value); otherwise a hint that
    names how far off it is and, where the ratio matches a known mistake, which one."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return f"{what} should be a number (measured {number(expected)}), got {type(value).__name__} {value!r}"
    if not math.isfinite(value):
        return f"{what} is {value}: the measured value is {number(expected)}"
    if close(value, expected, rtol, atol):
        return None
    got = f"{what} = {number(value)} but the run measured {number(expected)}"
    if expected == 0:
        return f"{got}: nothing to count here"
    if value == 0:
        return f"{got}: you answered 0"
    ratio = value / expected
    found = [why for r, why in mistakes if close(ratio, r, rtol)]
    if close(ratio, -1.0, rtol):
        found.append("the size is right, the sign is wrong")
    if world_size and world_size > 1:
        if close(ratio, world_size, rtol):
            found.append(
                f"{world_size}x too large, a factor of the world size: you counted all "
                f"{world_size} ranks where one rank's share was asked (or did not divide by n)"
            )
        if close(ratio, 1 / world_size, rtol):
            found.append(
                f"{world_size}x too small, a factor of the world size: you counted one "
                f"rank's share where the total over the {world_size} ranks was asked"
            )
    if found:  # ratios that coincide (2 ranks, 2 bytes) name every likely cause
        return f"{got}: " + "; or ".join(dict.fromkeys(found))
    mag = math.log10(abs(ratio))
    if abs(mag) >= 0.9:
        k = round(mag)
        return (
            f"{got}: off by about 10^{abs(k)} ({'too large' if k > 0 else 'too small'}): "
            f"check the units (bytes, KB, MB; per element or per tensor)"
        )
    return f"{got}: {ratio:.3g}x the measured value"


def fail_if(hint: str | None) -> None:
    from .checking import CheckFailed

    if hint is not None:
        raise CheckFailed(hint)


def shape_mismatch(value, local: tuple, full: tuple, world_size: int, *, what: str) -> str | None:
    """None when ``value`` is the local shape; otherwise what the shape got wrong
    (the global shape, transposed, the wrong dim divided, a factor of the world size)."""
    try:
        got = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        return f"{what}: answer with a shape tuple of {len(local)} ints, got {value!r}"
    local, full, n = tuple(local), tuple(full), world_size
    if got == local:
        return None
    if len(got) != len(local):
        return f"{what} is {len(local)}-D; your shape {got} has {len(got)} dims"
    split = [d for d in range(len(full)) if local[d] != full[d]]
    if got == full and split:
        return f"{what}: {got} is the whole (global) tensor; each of the {n} ranks holds 1/{n} of dim {split[0]}"
    if got == tuple(reversed(local)):
        return f"{what}: {got} is transposed: nn.Linear stores its weight as [out_features, in_features]"
    wrong = [d for d in range(len(got)) if got[d] != full[d]]
    if wrong and split and wrong != split and all(got[d] * n == full[d] for d in wrong):
        return f"{what}: you divided dim {wrong[0]} by {n}, but the ranks split dim {split[0]}"
    for d in split:
        if got[d] * n * n == full[d] or got[d] == full[d] * n:
            return (
                f"{what}: dim {d} is {got[d]}, off by a factor of the world size {n}: "
                f"it is {full[d]} split over {n} ranks"
            )
    return f"{what}: {got} is not what the ranks hold; the global shape is {full}, split over {n} ranks"
