"""Pipeline stages: which layers each stage holds, what it keeps in flight, its bubble.

Layers per chunk are given, even, or balanced as torchtitan deals them out; in-flight
micro-batches follow each schedule's warm-up on that real assignment, and the bubble is the
fill and drain through the other stages' layers, Narayanan et al. 2021's ``(p - 1)/(m v)``
when stages are even (docs/planner.md)."""

from __future__ import annotations

from .model_spec import ModelSpec

# PlanLayout (layout.py) is only named in annotations: layout.py calls rank_layers, so
# importing it here would make a cycle.

EMBEDDING_WEIGHT = 1  # torchtitan generate_llm_fqn_per_model_part(input_weight=1)
HEAD_WEIGHT = 1  # ... (output_weight=1): norm + output projection + loss


def chunk_layers(model: ModelSpec, layout: PlanLayout) -> tuple[int, ...]:
    """Transformer layers of each model chunk, in pipeline order (pp * v entries)."""
    p, v = layout.pp, layout.virtual_stages
    chunks = p * v
    given = layout.stage_layers
    if isinstance(given, tuple):
        if len(given) == chunks:
            return given
        out = [0] * chunks  # one count per rank: deal it over the rank's v chunks
        for rank, n in enumerate(given):
            for j in range(v):
                out[rank + j * p] = n // v + (1 if j < n % v else 0)
        return tuple(out)
    if given is None and model.layers % chunks == 0:
        return (model.layers // chunks,) * chunks
    return balanced_layers(model.layers, chunks)


def balanced_layers(layers: int, chunks: int) -> tuple[int, ...]:
    """torchtitan's split: embedding and head weigh one layer each; remainder to the front.

    Falls back to a plain even split when a chunk would be left with a negative count
    (more chunks than layers + 2).
    """
    if chunks == 1:
        return (layers,)
    units = layers + EMBEDDING_WEIGHT + HEAD_WEIGHT
    base, extra = divmod(units, chunks)
    out = [base + (1 if k < extra else 0) for k in range(chunks)]
    out[0] -= EMBEDDING_WEIGHT
    out[-1] -= HEAD_WEIGHT
    if min(out) < 0 or sum(out) != layers:
        base, extra = divmod(layers, chunks)
        out = [base + (1 if k < extra else 0) for k in range(chunks)]
    return tuple(out)


def rank_layers(model: ModelSpec, layout: PlanLayout) -> tuple[int, ...]:
    """Transformer layers held by each pipeline rank (its chunks summed)."""
    chunks = chunk_layers(model, layout)
    p = layout.pp
    return tuple(sum(chunks[r::p]) for r in range(p))


def in_flight_layers(model: ModelSpec, layout: PlanLayout, stage: int = 0) -> float:
    """Layers' worth of activations pipeline rank `stage` holds at its peak."""
    p, m, v = layout.pp, layout.microbatches, layout.virtual_stages
    per_rank = rank_layers(model, layout)
    if p == 1:
        return per_rank[0]
    if layout.schedule == "gpipe":
        return m * per_rank[stage]
    if layout.schedule != "interleaved":
        return min(p - stage, m) * per_rank[stage]
    chunks = chunk_layers(model, layout)
    forwards = min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v)
    held, left = 0, forwards
    # Megatron's interleaved order: blocks of p micro-batches through chunk 0, 1, ..., v-1
    for start in range(0, m, p):
        for j in range(v):
            take = min(p, m - start, left)
            held += take * chunks[stage + j * p]
            left -= take
            if left == 0:
                return held
    return held


def describe_in_flight(model: ModelSpec, layout: PlanLayout, stage: int = 0) -> str:
    """Why `in_flight_layers` holds what it holds, for the summary's activation line."""
    p, m, v = layout.pp, layout.microbatches, layout.virtual_stages
    mine = rank_layers(model, layout)[stage]
    if p == 1:
        return f"1 micro-batch x {mine} layers"
    if layout.schedule == "gpipe":
        return f"{m} micro-batches x {mine} layers (GPipe: every forward before the first backward)"
    if layout.schedule != "interleaved":
        return f"min(p - rank, m) = {min(p - stage, m)} micro-batches x {mine} layers (1F1B warm-up)"
    warmup = 2 * (p - stage - 1) + (v - 1) * p + 1
    if warmup >= m * v:
        return (
            f"{m} micro-batches x {v} chunks ({mine} layers): Megatron's interleaved order runs "
            f"every forward before the first backward when m = p"
        )
    return (
        f"2(p - rank - 1) + (v - 1)p + 1 = {warmup} chunk-forwards of {v} chunks ({mine} layers) "
        "before the first backward (Megatron's interleaved warm-up)"
    )


def assignment_bubble(model: ModelSpec, layout: PlanLayout) -> float:
    """Fill and drain idle time of the busiest rank as a fraction of its busy time."""
    if layout.pp <= 1:
        return 0.0
    per_rank = rank_layers(model, layout)
    busiest = max(per_rank)
    v = layout.virtual_stages if layout.schedule == "interleaved" else 1
    return (sum(per_rank) - busiest) / (v * layout.microbatches * busiest)


def describe_stages(model: ModelSpec, layout: PlanLayout) -> str:
    """'7, 8 x 14, 7' (runs of equal counts folded), per pipeline rank."""
    counts = rank_layers(model, layout)
    parts: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[j] == counts[i]:
            j += 1
        parts.append(f"{counts[i]} x {j - i}" if j - i > 2 else ", ".join([str(counts[i])] * (j - i)))
        i = j
    return ", ".join(parts)
