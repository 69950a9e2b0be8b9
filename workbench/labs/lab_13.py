"""Checks of lab 13 (one sharding, two frameworks): against the bytes and collectives that the
torch ranks (DTensor, the profiler) and the JAX ranks (NamedSharding, the compiled HLO) measured."""

from __future__ import annotations

from workbench.labs.checking import CheckFailed, checker
from workbench.labs.hints import mismatch

__all__ = ["check_fsdp_bytes", "check_tp_collective", "collective_name"]

# the spellings of one collective: HLO's, torch's functional op names, c10d's
_NAMES = {
    "all-reduce": ("all-reduce", "all_reduce", "allreduce"),
    "all-gather": ("all-gather", "all_gather", "allgather", "all_gather_into_tensor"),
    "reduce-scatter": ("reduce-scatter", "reduce_scatter", "reducescatter", "reduce_scatter_tensor"),
}


def collective_name(text: str) -> str | None:
    """HLO's name of a collective written any of the ways torch or XLA write it, else None."""
    key = str(text).strip().lower().split("::")[-1]
    for name, spellings in _NAMES.items():
        if key in spellings:
            return name
    return None


@checker("lab_13.fsdp_bytes")
def check_fsdp_bytes(value, *, torch_bytes: int, jax_bytes: int, total_bytes: int, world: int) -> str:
    """Parameter bytes one rank holds of the block under FSDP-style sharding (a number)."""
    if torch_bytes != jax_bytes:
        raise CheckFailed(
            f"the two frameworks disagree ({torch_bytes:,} on torch, {jax_bytes:,} on JAX): run the two "
            "FSDP cells again with the same weights"
        )
    hint = mismatch(
        value,
        torch_bytes,
        what="fsdp_bytes",
        world_size=world,
        mistakes=[(0.25, "you counted parameters; each fp32 parameter is 4 bytes")],
        rtol=0,
    )
    if hint:
        raise CheckFailed(hint)
    return f"each rank holds {torch_bytes:,} of the block's {total_bytes:,} bytes (1/{world}) on torch and on JAX"


@checker("lab_13.tp_collective")
def check_tp_collective(value, *, torch_ops: dict, jax_ops: dict) -> str:
    """The collective that TP-style sharding needs in both frameworks (its name, e.g. "all-gather")."""
    torch_seen = {collective_name(k) for k, n in torch_ops.items() if n} - {None}
    jax_seen = {collective_name(k) for k, n in jax_ops.items() if n} - {None}
    both = torch_seen & jax_seen
    name = collective_name(value) if isinstance(value, str) else None
    if name is None:
        raise CheckFailed(f"expected a collective's name such as 'all-gather' or 'all-reduce', got {value!r}")
    if name in both:
        return f"{name}: DTensor issues it ({sorted(torch_seen)}) and XLA's compiled step holds it ({sorted(jax_seen)})"
    if name == "all-gather":
        raise CheckFailed(
            "all-gather is FSDP's: it gathers the weight shards before use. TP keeps its weights split; "
            "what must it do with the partial sums of a row-parallel matmul?"
        )
    raise CheckFailed(f"{name} is not in both measured lists: torch {sorted(torch_seen)}, JAX {sorted(jax_seen)}")
