"""The model a dry run lays out, built on the meta device (shapes, no weights, no network).

``build`` is what the user gave :func:`workbench.dry_run`: a function returning an
``nn.Module`` or a transformers config (called under ``torch.device("meta")``), a
transformers config, or the name of a planner catalogue model (``"70b"``: a transformers
Llama config made from the catalogue's numbers). :func:`shape_of` reads back the shape
the planner needs (a :class:`workbench.planner.ModelSpec`'s fields) where the model has one.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["build_on_meta", "llama_config", "shape_of"]


def llama_config(name: str, seq_len: int):
    """A transformers ``LlamaConfig`` with the planner catalogue's numbers for ``name``."""
    from transformers import LlamaConfig

    from ...planner import ModelSpec

    spec = ModelSpec.preset(name, seq_len=seq_len)
    if spec.is_moe or not spec.gated_mlp:
        raise ValueError(
            f"{name!r} is not a Llama-shaped model of the catalogue (the dry run builds those from their "
            "numbers: 8b, 70b, 405b); give a function that returns the model or its transformers config"
        )
    return LlamaConfig(
        hidden_size=spec.hidden,
        intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        vocab_size=spec.vocab,
        max_position_embeddings=seq_len,
        tie_word_embeddings=spec.tied_embeddings,
        rope_theta=500000.0,
    )


def _from_config(config) -> nn.Module:
    from transformers import AutoModelForCausalLM

    impl = getattr(config, "_attn_implementation", None)
    # sdpa: the fused kernel a GPU run takes; pipeline stages need eager or sdpa
    return AutoModelForCausalLM.from_config(config, attn_implementation=impl or "sdpa")


def build_on_meta(build, seq_len: int) -> nn.Module:
    """The model ``build`` describes, its parameters and buffers on the meta device."""
    with torch.device("meta"):
        made = build() if callable(build) and not isinstance(build, str) else build
        if isinstance(made, str):
            made = llama_config(made, seq_len)
        if not isinstance(made, nn.Module):
            if not hasattr(made, "to_dict") or not hasattr(made, "model_type"):
                raise TypeError(
                    f"build gave a {type(made).__name__}; give a function that returns an nn.Module or a "
                    "transformers config, a transformers config, or a catalogue name such as '70b'"
                )
            made = _from_config(made)
    off = sorted({str(t.device) for t in [*made.parameters(), *made.buffers()]} - {"meta"})
    if off:
        raise ValueError(
            f"the model's tensors are on {', '.join(off)}, not the meta device: build it without a device "
            "(the dry run calls build under torch.device('meta')), or with device='meta'"
        )
    return made


def shape_of(model: nn.Module, seq_len: int) -> dict | None:
    """The planner ``ModelSpec`` fields of ``model`` (a transformers decoder config, or the
    workbench GPT's ``cfg``), or ``None`` where it has neither."""
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "num_hidden_layers"):
        heads = int(cfg.num_attention_heads)
        experts = int(getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None) or 1)
        return {
            "layers": int(cfg.num_hidden_layers),
            "hidden": int(cfg.hidden_size),
            "heads": heads,
            "kv_heads": int(getattr(cfg, "num_key_value_heads", None) or heads),
            "ffn": int(getattr(cfg, "moe_intermediate_size", None) or cfg.intermediate_size),
            "vocab": int(cfg.vocab_size),
            "seq_len": int(seq_len),
            "experts": experts,
            "top_k": int(getattr(cfg, "num_experts_per_tok", 1) or 1) if experts > 1 else 1,
            "tied_embeddings": bool(getattr(cfg, "tie_word_embeddings", False)),
            "name": str(getattr(cfg, "model_type", "custom")),
        }
    gpt = getattr(model, "moe_cfg", None) or getattr(model, "cfg", None)
    if gpt is not None:
        from ...planner.live import config_dict, model_spec_from_config

        spec = model_spec_from_config(config_dict(gpt), seq_len=seq_len)
        return {
            k: getattr(spec, k)
            for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len", "experts", "top_k")
        } | {"tied_embeddings": spec.tied_embeddings, "name": spec.name}
    return None


def _named(model: nn.Module, module) -> str | None:
    return next((n for n, m in model.named_modules() if m is module), None) if module is not None else None


def _ends(model: nn.Module, vocab: int) -> tuple[str | None, str | None]:
    """The names of the input embedding and the output head (``None`` where not found)."""
    emb = getattr(model, "get_input_embeddings", lambda: None)()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if emb is None:
        emb = next((m for m in model.modules() if isinstance(m, nn.Embedding) and m.num_embeddings == vocab), None)
    if head is None:
        head = next(
            (m for m in reversed(list(model.modules())) if isinstance(m, nn.Linear) and m.out_features == vocab), None
        )
    return _named(model, emb), _named(model, head)


def layout_facts(model: nn.Module, spec, world: int, hints, vocab: int) -> dict:
    """What the planner must know of this model laid out by ``spec``, read off the strategy's
    own tensor-parallel plan: ``sequence_parallel``, ``embedding_tp`` (the plan splits the
    embedding), ``logits_tp`` (the head's output stays split), ``attention`` (``eager`` where
    the model computes the scores as tensors), ``implementation`` (``transformers`` for a
    Hugging Face model)."""
    from torch.distributed.tensor import Replicate

    from ...strategies.tensor_parallel import resolve_tp_plan

    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    facts = {
        "sequence_parallel": False,
        "embedding_tp": True,
        "logits_tp": True,
        "attention": "eager" if impl == "eager" else "flash",
        "implementation": "transformers" if type(model).__module__.startswith("transformers.") else "megatron",
    }
    tp = spec.dims(world).tp
    if tp > 1:
        plan = resolve_tp_plan(model, tp, tp_plan=hints.tp_plan, sequence_parallel=spec.sequence_parallel)
        emb, head = _ends(model, vocab)
        style = plan.entries.get(head)
        layouts = getattr(style, "output_layouts", None) or ()
        facts["sequence_parallel"] = bool(plan.sequence_parallel)
        facts["embedding_tp"] = emb in plan.entries
        facts["logits_tp"] = style is not None and not any(isinstance(x, Replicate) for x in layouts)
    return facts
