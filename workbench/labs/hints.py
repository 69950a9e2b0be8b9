"""What is off between a student's number and the measured one, in words (notebook side).

Checkers call :func:`mismatch` with the mistakes a student is likely to make for that
answer (``(ratio, why)``: counted elements instead of bytes is a ratio of 1/4 for fp32);
the generic ones (wrong sign, a factor of the world size, orders of magnitude) follow.
"""
from __future__ import annotations

import math
from typing import Iterable

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


def mismatch(value: float, expected: float, *, what: str, mistakes: Iterable[Mistake] = (),
             world_size: int | None = None, rtol: float = 1e-2, atol: float = 0.0) -> str | None:
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
    for r, why in mistakes:
        if close(ratio, r, rtol):
            return f"{got}: {why}"
    if close(ratio, -1.0, rtol):
        return f"{got}: the size is right, the sign is wrong"
    if world_size and world_size > 1:
        if close(ratio, world_size, rtol):
            return (f"{got}: {world_size}x too large, a factor of the world size: "
                    f"you counted all {world_size} ranks where one rank's share was asked (or did not divide by n)")
        if close(ratio, 1 / world_size, rtol):
            return (f"{got}: {world_size}x too small, a factor of the world size: "
                    f"you counted one rank's share where the total over the {world_size} ranks was asked")
    mag = math.log10(abs(ratio))
    if abs(mag) >= 0.9:
        k = round(mag)
        return (f"{got}: off by about 10^{abs(k)} ({'too large' if k > 0 else 'too small'}): "
                f"check the units (bytes, KB, MB; per element or per tensor)")
    return f"{got}: {ratio:.3g}x the measured value"


def fail_if(hint: str | None) -> None:
    from .checking import CheckFailed

    if hint is not None:
        raise CheckFailed(hint)
