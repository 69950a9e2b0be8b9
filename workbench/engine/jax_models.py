"""A Llama-shaped parameter set as global JAX arrays, sharded FSDP-style or TP-style.

The shapes are the planner's :class:`workbench.planner.ModelSpec`, so that the planner's
FSDP/TP arithmetic and the bytes each JAX rank really holds are about the same model
(``workbench.planner.sharded_bytes``). Matrices are stored ``(in, out)``, as ``x @ w``."""

from __future__ import annotations

import zlib

STYLES = ("fsdp", "tp")


def llama_shapes(config: dict) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, role) for ``config`` (ModelSpec's fields: layers, hidden, heads,
    kv_heads, ffn, vocab); role is ``column``, ``row``, ``vocab_rows``, ``vocab_cols`` or ``norm``."""
    h, ffn, vocab = config["hidden"], config["ffn"], config["vocab"]
    kv = config["kv_heads"] * (h // config["heads"])
    out: dict[str, tuple[tuple[int, ...], str]] = {"embed": ((vocab, h), "vocab_rows")}
    for i in range(config["layers"]):
        p = f"layers.{i}."
        out[p + "attn_norm"] = ((h,), "norm")
        out[p + "wq"] = ((h, h), "column")
        out[p + "wk"] = ((h, kv), "column")
        out[p + "wv"] = ((h, kv), "column")
        out[p + "wo"] = ((h, h), "row")
        out[p + "mlp_norm"] = ((h,), "norm")
        out[p + "w_gate"] = ((h, ffn), "column")
        out[p + "w_up"] = ((h, ffn), "column")
        out[p + "w_down"] = ((ffn, h), "row")
    out["final_norm"] = ((h,), "norm")
    out["head"] = ((h, vocab), "vocab_cols")
    return out


def spec_for(role: str, shape: tuple[int, ...], style: str, axis: str):
    """The ``PartitionSpec`` of one tensor in ``style`` over the mesh axis ``axis``.

    ``fsdp``: dim 0 split over all ranks (ZeRO-3's parameter shards). ``tp``: Megatron's
    split, Q/K/V, gate and up by output columns, O and down by input rows, embedding and
    head by vocabulary; norms whole on every rank."""
    from jax.sharding import PartitionSpec as P

    if style == "fsdp":
        return P(axis, *([None] * (len(shape) - 1)))
    if role in ("column", "vocab_cols"):
        return P(None, axis)
    if role in ("row", "vocab_rows"):
        return P(axis, None)
    return P()


def global_values(name: str, shape: tuple[int, ...], seed: int = 0):
    """The same numbers for ``name`` on every rank (and in a one-process reference)."""
    import numpy as np

    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return (rng.standard_normal(shape) * 0.02).astype(np.float32)


def llama_params(config: dict, style: str, *, axis: str = "x", seed: int = 0) -> dict:
    """The model's parameters as global arrays on a 1-D mesh of every device, laid out by ``style``."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding

    if style not in STYLES:
        raise ValueError(f"style {style!r} is not known: use one of {', '.join(STYLES)}")
    mesh = Mesh(np.array(jax.devices()), (axis,))
    params = {}
    for name, (shape, role) in llama_shapes(config).items():
        values = global_values(name, shape, seed)
        sharding = NamedSharding(mesh, spec_for(role, shape, style, axis))
        params[name] = jax.make_array_from_callback(shape, sharding, lambda index, v=values: v[index])
    return params
