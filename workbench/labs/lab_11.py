"""Checks of lab 11 (failures as a lab): the answers are judged on the evidence the run
produced (the ranks' stacks, their gradients, the checkpoints on disk), never on stored answers."""
from __future__ import annotations

from workbench.cluster.diagnosis import main_frames
from workbench.labs import CheckFailed, checker

__all__ = ["COLLECTIVES", "blocked_in", "check_hang", "check_nan_rank", "check_rollback"]

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "all_to_all", "send", "recv")


def blocked_in(stack: str) -> str | None:
    """The collective a rank's cell thread is inside (innermost first), or None."""
    for frame in main_frames(stack):
        for name in COLLECTIVES:
            if f"in {name}" in frame or f"in {name}_" in frame:
                return name
    return None


@checker("lab_11.hang")
def check_hang(value, *, stacks: dict) -> None:
    """``value = (culprit rank, collective the others wait in)`` against the ranks' stacks."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise CheckFailed(f"expected (rank, collective name), got {value!r}: replace the `...`")
    rank, coll = value
    if rank is Ellipsis or coll is Ellipsis:
        raise CheckFailed("no answer yet: replace both `...` (the rank, and the collective's name as a string)")
    stacks = {int(k): v for k, v in stacks.items()}
    blocked = {r: blocked_in(s) for r, s in stacks.items()}
    waiting = {r: c for r, c in blocked.items() if c}
    culprits = [r for r, c in blocked.items() if c is None]
    if not waiting or not culprits:
        raise CheckFailed(f"the stacks do not show a rank stuck against the others (in a collective: "
                          f"{sorted(waiting)}); run the drill cell again")
    if rank not in stacks:
        raise CheckFailed(f"there is no rank {rank!r}; the ranks are {sorted(stacks)}")
    if rank in waiting:
        raise CheckFailed(f"rank {rank} is waiting inside {waiting[rank]}: it is the victim, not the cause. "
                          "The cause is the rank that never arrived at the collective - look for the stack "
                          "without one")
    want = sorted(set(waiting.values()))
    if coll not in want:
        raise CheckFailed(f"rank {rank} is right, but the others wait in {' / '.join(want)}, not {coll!r} "
                          "(read the innermost torch.distributed frame of a waiting rank)")
    return f"rank {rank} never reached the {coll} that rank(s) {sorted(waiting)} waited in"


@checker("lab_11.nan_rank")
def check_nan_rank(value, *, before: list, after: list, yours: list | None = None) -> None:
    """The rank whose own gradients were non-finite before the all-reduce. ``before``/``after``:
    per rank, the parameters with non-finite gradients before/after it, measured on the ranks;
    ``yours``: what the student's own per-rank test found."""
    if yours is not None and any(y is Ellipsis for y in yours):
        raise CheckFailed("your per-rank test (local_bad, on the ranks) is still `...`: replace it first")
    if yours is not None:
        wrong = [r for r, (y, b) in enumerate(zip(yours, before)) if sorted(y or []) != sorted(b)]
        if wrong:
            r = wrong[0]
            raise CheckFailed(f"your per-rank test found {yours[r]!r} on rank {r}, but its gradients before the "
                              f"all-reduce are non-finite in {before[r]!r}: test every parameter's .grad with "
                              "torch.isfinite(...).all()")
    bad = [r for r, b in enumerate(before) if b]
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckFailed(f"expected one rank number, got {value!r}")
    if value in bad:
        return f"the non-finite gradients started on rank {value}; after the all-reduce every rank had them"
    if 0 <= value < len(after) and after[value]:
        raise CheckFailed(f"rank {value} has NaN gradients only after the all-reduce - so does every rank, because "
                          "a sum with one NaN is NaN; look at the gradients BEFORE the all-reduce")
    raise CheckFailed(f"rank {value}'s gradients were finite before the all-reduce; the non-finite ones were on "
                      f"rank(s) {bad}")


@checker("lab_11.rollback")
def check_rollback(value, *, checkpoints: list, nan_step: int) -> None:
    """``value``: the step of the checkpoint to roll back to. ``checkpoints``: one dict per
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
        raise CheckFailed(f"step {value} is at or after the NaN (step {nan_step}): what it holds may already be "
                          "poisoned; roll back to before the NaN")
    if c["problems"]:
        raise CheckFailed(f"{c['name']} (step {value}) is damaged - {c['problems'][0]} - and would fail to load; "
                          "take the newest checkpoint that verifies")
    raise CheckFailed(f"step {value} is good but older than needed: {best['name']} (step {best['step']}) also verifies "
                      f"and is before the NaN, and loses {best['step'] - value} fewer steps of training")
