"""Checks of lab 09 (sequence and context parallelism), against the run's own measurements."""

from __future__ import annotations

import math

from workbench.labs.checking import CheckFailed, checker

__all__ = ["check_attention_bytes", "check_sp_bytes", "check_ring_attention"]


def _numbers(value, n: int, what: str) -> list[float]:
    if (
        not isinstance(value, (list, tuple))
        or len(value) != n
        or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value)
    ):
        raise CheckFailed(
            f"expected {what}: a list of {n} finite numbers, got {value!r}; replace the `...` with your formula"
        )
    return [float(v) for v in value]


@checker("lab_09.attention_bytes")
def check_attention_bytes(value, *, measured, seqs, batch: int, heads: int, head_dim: int) -> None:
    """Bytes eager attention saves for backward at each sequence length in ``seqs``
    (the student's formula evaluated there) against the bytes the ranks' hooks counted."""
    got = _numbers(value, len(seqs), "the saved bytes at each sequence length")
    if all(abs(g - m) <= 1e-9 * m for g, m in zip(got, measured)):
        return (
            f"eager attention saves 4·b·heads·(3·s·d + s²) bytes: x{measured[-1] / measured[0]:.1f} "
            f"from s={seqs[0]} to s={seqs[-1]}"
        )
    b, h, d = batch, heads, head_dim
    linear = [4 * b * h * 3 * s * d for s in seqs]
    square = [4 * b * h * s * s for s in seqs]
    if all(abs(g - m / 4) <= 1e-9 * m for g, m in zip(got, measured)):
        raise CheckFailed("you counted elements; fp32 holds 4 bytes per element")
    if all(abs(g - lin) <= 1e-9 * lin for g, lin in zip(got, linear)):
        raise CheckFailed(
            "your count grows linearly in s: it has q, k, v but not the s x s softmax output "
            "that eager attention keeps for backward, the term that blows up"
        )
    if all(abs(g - sq) <= 1e-9 * sq for g, sq in zip(got, square)):
        raise CheckFailed(
            "you have the s x s scores but not q, k and v (each b x heads x s x head_dim), which backward needs too"
        )
    if all(abs(g * heads - m) <= 1e-9 * m for g, m in zip(got, measured)):
        raise CheckFailed(f"off by the number of heads ({heads}): every head has its own s x s scores")
    ratio = got[-1] / got[0] if got[0] else float("inf")
    want = measured[-1] / measured[0]
    raise CheckFailed(
        f"measured {[int(m) for m in measured]} bytes, your formula gives {[int(g) for g in got]}; "
        f"from s={seqs[0]} to s={seqs[-1]} the measurement grows x{want:.2f}, yours x{ratio:.2f}"
    )


@checker("lab_09.sp_bytes")
def check_sp_bytes(value, *, buffer_bytes: int, ranks: int, tp_wire: float) -> None:
    """Bytes one rank sends for sequence parallel's reduce-scatter + all-gather of a
    ``buffer_bytes`` activation (ring), which must equal TP's all-reduce (``tp_wire``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckFailed(f"expected a number of bytes, got {value!r}: replace the `...`")
    n, B = ranks, buffer_bytes
    want = 2 * (n - 1) / n * B
    if abs(value - want) <= 1e-9 * want and abs(want - tp_wire) <= 1e-9 * want:
        return f"SP's pair sends {value:,.0f} bytes per rank, the same as TP's all-reduce"
    if abs(value - (n - 1) / n * B) <= 1e-9 * B:
        raise CheckFailed(
            "that is one of the two collectives; SP runs a reduce-scatter AND an all-gather, (n-1)/n x B each"
        )
    if abs(value - 2 * (n - 1) / n * B / n) <= 1e-9 * B:
        raise CheckFailed(
            f"off by the world size ({n}): the reduce-scatter's input is the FULL activation "
            "(every rank's partial sum), the all-gather's output too"
        )
    if abs(value - 2 * B) <= 1e-9 * B:
        raise CheckFailed("2B is the many-rank limit; each collective sends (n-1)/n x B per rank")
    raise CheckFailed(
        f"expected 2(n-1)/n x B = {want:,.0f} bytes (the same as TP's all-reduce, {tp_wire:,.0f}), got {value:,.0f}"
    )


def _rows(x) -> list[list[float]]:
    return [list(map(float, row)) for row in x]


def _diff(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


@checker("lab_09.ring_attention")
def check_ring_attention(value, *, reference, local_only, tol: float = 1e-5) -> None:
    """Ring attention outputs (per rank, ``[s/n][head_dim]`` lists) against full attention on
    the gathered sequence (``reference``) and attention over the rank's own block only."""
    if not isinstance(value, (list, tuple)) or len(value) != len(reference):
        raise CheckFailed(f"expected one output per rank ({len(reference)}), got {type(value).__name__}")
    if any(not isinstance(v, (list, tuple)) for v in value):
        raise CheckFailed("an output is not a list of rows: did the blank stay `...`?")
    worst = max(_diff(_rows(v), _rows(ref)) for v, ref in zip(value, reference))
    if worst <= tol:
        return f"ring attention equals full attention on every rank (max abs diff {worst:.1e}, tolerance {tol:g})"
    if max(_diff(_rows(v), _rows(loc)) for v, loc in zip(value, local_only)) <= tol:
        raise CheckFailed(
            "each rank attended only to its own keys: the K/V blocks never came round the ring "
            "(use the received k_blk, v_blk in every step)"
        )
    # a constant factor per row: the normalisation by the running sum is wrong
    ratios = []
    for v, ref in zip(value, reference):
        for rv, rr in zip(_rows(v), _rows(ref)):
            rs = [a / b for a, b in zip(rv, rr) if abs(b) > 1e-3]
            if rs:
                ratios.append(max(rs) - min(rs) <= 1e-3 * max(1.0, abs(sum(rs) / len(rs))))
    if ratios and all(ratios):
        raise CheckFailed(
            "every output row is the right direction times a wrong factor: the normalisation is off; "
            "rescale the running sum l by exp(m_old - m_new) and divide by l at the end"
        )
    raise CheckFailed(
        f"max |ring - full attention| = {worst:.3g}, above the tolerance {tol:g}: when the running "
        "max grows, BOTH the output accumulator and the running sum must be multiplied by "
        "exp(m_old - m_new) before adding the new block"
    )
