"""Checks of lab 10 (a 3D layout end to end), against the groups and bytes measured on the ranks."""

from __future__ import annotations

from workbench.labs.checking import CheckFailed, checker

__all__ = ["check_group", "check_param_bytes"]


@checker("lab_10.group")
def check_group(value, *, groups: dict, dim: str, world: int) -> None:
    """The ranks of rank 0's ``dim`` group; ``groups``: mesh dim -> ranks, read from the mesh."""
    if not isinstance(value, (list, tuple, set)) or not all(isinstance(v, int) for v in value):
        raise CheckFailed(f"expected a list of rank numbers, got {value!r}: replace the `...`")
    got, want = sorted(value), sorted(groups[dim])
    if got == want:
        return f"rank 0's {dim} group is {want}"
    for other, ranks in groups.items():
        if other != dim and got == sorted(ranks):
            what = {
                "pp": "the pipeline group: stages pass activations (send/recv) there",
                "tp": "the tensor-parallel group: TP's all-reduces run there",
            }.get(other, f"the {other} group")
            raise CheckFailed(f"{got} is {what}; the {dim} group is another dimension of the mesh")
    if got == list(range(world)):
        raise CheckFailed(
            f"that is the whole world; a collective of one mesh dimension runs in a group of {len(want)} ranks"
        )
    if 0 not in got:
        raise CheckFailed("rank 0 is in its own group")
    raise CheckFailed(
        f"expected {len(want)} ranks of the {dim} dimension (row-major over the mesh {list(groups)}), got {got}"
    )


@checker("lab_10.param_bytes")
def check_param_bytes(value, *, measured: int, stage_bytes: int, pp: int, dp_shard: int) -> None:
    """Parameter bytes one rank holds under pp x dp_shard, against what its model holds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckFailed(f"expected a number of bytes, got {value!r}: replace the `...`")
    if value == measured:
        return f"rank 0 holds {measured:,} parameter bytes = its stage's {stage_bytes:,} / dp_shard={dp_shard}"
    if value == stage_bytes:
        raise CheckFailed(f"that is the whole stage; FSDP2 shards it over dp_shard={dp_shard} ranks")
    if value == stage_bytes // (pp * dp_shard) or value == stage_bytes / (pp * dp_shard):
        raise CheckFailed(
            f"stage_bytes is already one stage's share: divide by dp_shard ({dp_shard}) only, not by pp x dp_shard"
        )
    if value * 4 == measured:
        raise CheckFailed("you counted parameters; each fp32 parameter is 4 bytes")
    raise CheckFailed(f"rank 0 holds {measured:,} bytes; your answer is {value:,}")
