"""Checks of lab 14 (a dry run at full scale): against the bytes the dry run counted on its
fake ranks, the planner's side-by-side, and what the live ranks measured."""

from __future__ import annotations

from workbench.labs.checking import CheckFailed, checker
from workbench.labs.hints import mismatch, number

__all__ = ["check_stage_param_bytes", "check_peak_term", "check_live_optim_bytes"]

GB = 1e9


@checker("lab_14.stage_param_bytes")
def check_stage_param_bytes(value, *, dry_bytes: int, paper_bytes: float, dp_shard: int, tp: int) -> str:
    """Parameter bytes one rank of a middle pipeline stage holds (a number)."""
    hint = mismatch(
        value,
        dry_bytes,
        what="stage_param_bytes",
        mistakes=[
            (
                0.5,
                "2 bytes a parameter is the paper's 16-bit copy; FSDP2 keeps the fp32 master as the parameter itself",
            ),
            (0.25, "you counted parameters; each is 4 bytes (fp32)"),
            (dp_shard, f"FSDP2 splits each tensor-parallel shard again over dp_shard={dp_shard}"),
            (tp, f"tensor parallel splits the attention and MLP matrices over tp={tp}"),
            (dp_shard * tp, f"a rank holds 1/(tp x dp_shard) = 1/{dp_shard * tp} of its stage"),
        ],
        rtol=1e-3,
    )
    if hint:
        raise CheckFailed(hint)
    return (
        f"a middle stage's rank holds {number(dry_bytes)} bytes of parameters, twice the paper's {number(paper_bytes)}"
    )


@checker("lab_14.peak_term")
def check_peak_term(value, *, effects: dict, stage: int) -> str:
    """The term read off the dry run that moves the paper's peak of ``stage`` the most (its name)."""
    if value not in effects:
        raise CheckFailed(f"expected one of {sorted(effects)}, got {value!r}")
    best = max(effects, key=lambda k: effects[k])
    if value == best:
        return f"{value}: it moves stage {stage}'s peak by {effects[value] / GB:.1f} GB, the most of {sorted(effects)}"
    if effects[value] == 0:
        raise CheckFailed(
            f"{value} does not move stage {stage}'s peak at all here (set alone it changes "
            f"{'nothing this stage holds' if value != 'master_params' else 'how the 16 bytes a parameter are split, not their sum'})"
        )
    raise CheckFailed(
        f"{value} moves stage {stage}'s peak by {effects[value] / GB:.1f} GB; another moves it by "
        f"{effects[best] / GB:.1f} GB: which tensors does the first stage hold the most of at its peak?"
    )


@checker("lab_14.live_optim_bytes")
def check_live_optim_bytes(value, *, live_bytes: int, dry_bytes: int, rank: int) -> str:
    """Optimizer-state bytes a live rank holds, read off the dry run's positions (a number)."""
    if live_bytes != dry_bytes:
        raise CheckFailed(
            f"the dry run ({dry_bytes:,}) and live rank {rank} ({live_bytes:,}) disagree: run both cells again"
        )
    hint = mismatch(
        value,
        live_bytes,
        what="live_optim_bytes",
        mistakes=[(0.5, "Adam keeps two moments a parameter: exp_avg and exp_avg_sq")],
        rtol=1e-3,
    )
    if hint:
        raise CheckFailed(hint)
    return f"rank {rank} holds {live_bytes:,} bytes of optimizer state, as its position in the dry run said"
