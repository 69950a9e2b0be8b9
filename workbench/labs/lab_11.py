"""Checks of lab 11 (failures as a lab): the answers are judged on the evidence the run
produced (the ranks' stacks, their gradients, the checkpoints on disk), never on stored answers."""

from __future__ import annotations

from workbench.labs.checking import CheckFailed, checker
from workbench.notebook.cluster.diagnosis import main_frames

__all__ = [
    "COLLECTIVES",
    "blocked_in",
    "check_culprit",
    "check_blocked_in",
    "check_local_bad",
    "check_nan_rank",
    "check_rollback",
]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all", "send", "recv")


def blocked_in(stack: str) -> str | None:
    """The collective a rank's cell thread is inside (innermost first), or None."""
    for frame in main_frames(stack):
        for name in COLLECTIVES:
            if f"in {name}" in frame or f"in {name}_" in frame:
                return name
    return None


def _evidence(stacks: dict) -> tuple[dict, list]:
    stacks = {int(k): v for k, v in stacks.items()}
    blocked = {r: blocked_in(s) for r, s in stacks.items()}
    waiting = {r: c for r, c in blocked.items() if c}
    culprits = [r for r, c in blocked.items() if c is None]
    if not waiting or not culprits:
        raise CheckFailed(
            f"the stacks do not show a rank stuck against the others (in a collective: "
            f"{sorted(waiting)}); run the drill cell again"
        )
    return waiting, culprits


@checker("lab_11.culprit")
def check_culprit(value, *, stacks: dict) -> str:
    """The rank that holds the others up (an int), read from the ranks' stacks."""
    waiting, culprits = _evidence(stacks)
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckFailed(f"expected one rank number, got {value!r}")
    if value in waiting:
        raise CheckFailed(
            f"rank {value} is waiting inside {waiting[value]}: it is the victim, not the cause. "
            "The cause is the rank that never arrived at the collective - look for the stack "
            "without one"
        )
    if value not in culprits:
        raise CheckFailed(f"there is no rank {value}; the ranks are {sorted(set(waiting) | set(culprits))}")
    return f"rank {value} never reached the collective that rank(s) {sorted(waiting)} waited in"


@checker("lab_11.blocked_in")
def check_blocked_in(value, *, stacks: dict) -> str:
    """The collective the other ranks wait in (its torch.distributed name, a string)."""
    waiting, _ = _evidence(stacks)
    want = sorted(set(waiting.values()))
    if value not in want:
        raise CheckFailed(
            f"the waiting ranks are in {' / '.join(want)}, not {value!r} "
            "(read the innermost torch.distributed frame of a waiting rank)"
        )
    return f"rank(s) {sorted(waiting)} wait in {value}"


@checker("lab_11.local_bad")
def check_local_bad(value, *, truth: list) -> str:
    """Per rank, the names of the parameters whose local gradient is not finite (your test on the ranks)."""
    if not isinstance(value, (list, tuple)) or len(value) != len(truth):
        raise CheckFailed(f"expected one list of names per rank ({len(truth)}), got {value!r}")
    if any(v is Ellipsis for v in value):
        raise CheckFailed("local_bad is still `...` on the ranks: replace it in the cell above")
    for r, (v, t) in enumerate(zip(value, truth)):
        if sorted(v) != sorted(t):
            raise CheckFailed(
                f"your test found {list(v)!r} on rank {r}, but its gradients are non-finite in {t!r}: "
                "test every parameter's .grad with torch.isfinite(...).all()"
            )
    return "your per-rank test finds exactly the non-finite gradients on every rank"


@checker("lab_11.nan_rank")
def check_nan_rank(value, *, before: list, after: list) -> str:
    """The rank the NaN came from (an int). ``before``/``after``: per rank, the parameters with
    non-finite gradients before/after the all-reduce, measured on the ranks."""
    bad = [r for r, b in enumerate(before) if b]
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckFailed(f"expected one rank number, got {value!r}")
    if value in bad:
        return f"the non-finite gradients started on rank {value}; after the all-reduce every rank had them"
    if 0 <= value < len(after) and after[value]:
        raise CheckFailed(
            f"rank {value} has NaN gradients only after the all-reduce - so does every rank, because "
            "a sum with one NaN is NaN; look at the gradients BEFORE the all-reduce"
        )
    raise CheckFailed(
        f"rank {value}'s gradients were finite before the all-reduce; the non-finite ones were on rank(s) {bad}"
    )


@checker("lab_11.rollback")
def check_rollback(value, *, checkpoints: list, nan_step: int) -> str:
    """The step of the checkpoint to roll back to (an int). ``checkpoints``: one dict per
    checkpoint on disk, ``{"name", "step", "problems"}`` (problems: what verification found)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckFailed(f"expected a checkpoint's step (an int), got {value!r}")
    good = [c for c in checkpoints if not c["problems"] and c["step"] < nan_step]
    if not good:
        raise CheckFailed("no verified checkpoint before the NaN step: run the training cells again")
    best = max(good, key=lambda c: c["step"])
    if value == best["step"]:
        return f"{best['name']} (step {value}) is the newest checkpoint that verifies and precedes the NaN (step {nan_step})"
    chosen = [c for c in checkpoints if c["step"] == value]
    if not chosen:
        raise CheckFailed(f"there is no checkpoint at step {value}; on disk: {sorted(c['step'] for c in checkpoints)}")
    c = chosen[0]
    if value >= nan_step:
        raise CheckFailed(
            f"step {value} is at or after the NaN (step {nan_step}): what it holds may already be "
            "poisoned; roll back to before the NaN"
        )
    if c["problems"]:
        raise CheckFailed(
            f"{c['name']} (step {value}) is damaged - {c['problems'][0]} - and would fail to load; "
            "take the newest checkpoint that verifies"
        )
    raise CheckFailed(
        f"step {value} is good but older than needed: {best['name']} (step {best['step']}) also verifies "
        f"and is before the NaN, and loses {best['step'] - value} fewer steps of training"
    )
