"""The planner counts LoRA: adapters as peft adds them, and no gradient or optimizer state
for the frozen base (pure arithmetic, checked against peft's own count on a meta-device model)."""

from __future__ import annotations

import pytest

from workbench.planner.arguments import plan_from_args
from workbench.planner.layout import PlanLayout
from workbench.planner.memory import STATE_BYTES, memory_per_rank
from workbench.planner.model_spec import ModelSpec

SMALL = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=100, seq_len=32)


def test_lora_parameter_count_is_pefts_for_all_linear():
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=100,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    with torch.device("meta"):
        model = peft.get_peft_model(LlamaForCausalLM(cfg), peft.LoraConfig(r=8, target_modules="all-linear"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    attention, mlp = SMALL.lora_params_per_layer(8)
    assert SMALL.layers * (attention + mlp) == trainable


def test_frozen_base_has_no_gradients_or_optimizer_state_only_the_adapters_do():
    full = memory_per_rank(SMALL, PlanLayout(dp_shard=2, zero_stage=3))
    lora = memory_per_rank(SMALL, PlanLayout(dp_shard=2, zero_stage=3, lora_rank=8))
    p, g, o = STATE_BYTES["bf16"]
    adapters = SMALL.layers * sum(SMALL.lora_params_per_layer(8)) / 2  # sharded over the 2 ranks
    assert lora.gradients == pytest.approx(g * adapters)
    assert lora.optimizer == pytest.approx(o * adapters)
    assert lora.parameters == pytest.approx(full.parameters + p * adapters)
    assert lora.activations == full.activations


def test_lora_flag_on_a_70b_plan_frees_the_optimizer_state():
    full = plan_from_args("--model 70b --hw h100 --gpus 64 --fsdp --tp 8")
    lora = plan_from_args("--model 70b --hw h100 --gpus 64 --fsdp --tp 8 --lora 16")
    assert lora.memory.optimizer < 0.01 * full.memory.optimizer
    assert lora.memory.parameters > full.memory.parameters  # the adapters are held beside the base
    with pytest.raises(ValueError, match="--lora"):
        plan_from_args("--model 70b --hw h100 --gpus 64 --fsdp --lora 0")
