"""Memory per rank, checked against numbers worked by hand."""

from __future__ import annotations

import pytest

from workbench.planner import (
    ModelSpec,
    PlanLayout,
    activation_bytes_per_layer,
    load_hardware,
    memory_per_rank,
    state_bytes_per_param,
)
from workbench.planner.memory import in_flight_layers, saved_sbh, saved_tensors, score_sbh

TINY = ModelSpec(layers=8, hidden=8, heads=2, kv_heads=2, ffn=32, vocab=16, seq_len=4)
N = TINY.params().total


def states(layout, model=TINY):
    m = memory_per_rank(model, layout)
    return m.parameters, m.gradients, m.optimizer


def test_mixed_precision_adam_is_16_bytes_per_param():
    assert state_bytes_per_param("bf16") == 16 == 2 + 2 + 12
    assert states(PlanLayout()) == (2 * N, 2 * N, 12 * N)
    assert sum(states(PlanLayout(precision="fp32"))) == 16 * N
    assert states(PlanLayout(precision="fp32")) == (4 * N, 4 * N, 8 * N)


def test_ddp_replicates_everything():
    assert states(PlanLayout(dp_replicate=8)) == (2 * N, 2 * N, 12 * N)


def test_zero1_shards_only_the_12_bytes():
    assert states(PlanLayout(dp_shard=8, zero_stage=1)) == (2 * N, 2 * N, 12 * N / 8)


def test_zero2_also_shards_gradients():
    assert states(PlanLayout(dp_shard=8, zero_stage=2)) == (2 * N, 2 * N / 8, 12 * N / 8)


def test_zero3_divides_model_states_by_dp():
    assert sum(states(PlanLayout(dp_shard=8, zero_stage=3))) == pytest.approx(16 * N / 8)


def test_hsdp_shards_over_dp_shard_only():
    layout = PlanLayout(dp_replicate=4, dp_shard=2, zero_stage=3)
    assert sum(states(layout)) == pytest.approx(16 * N / 2)


def test_offload_moves_optimizer_to_cpu():
    m = memory_per_rank(TINY, PlanLayout(dp_shard=2, zero_stage=1, optimizer_offload=True))
    assert m.optimizer == 0 and m.cpu_offload == 12 * N / 2


# Korthikanti et al.'s GPT block: MHA, 4h GELU MLP, dropout
SMALL = ModelSpec(layers=8, hidden=8, heads=2, kv_heads=2, ffn=32, vocab=16, seq_len=4, gated_mlp=False, dropout=True)


def test_activation_formula_by_hand():
    # s=4, b=2, h=8, a=2: sbh = 64; 34*sbh = 2176; 5*a*s^2*b = 5*2*16*2 = 320
    # (eager attention stores the scores; the flash default is tested in
    # test_planner_attention_fp8_cp.py)
    base = dict(micro_batch_size=2, attention="eager")
    assert activation_bytes_per_layer(SMALL, PlanLayout(**base)) == 2176 + 320
    # TP=2 with sequence parallel: everything / t
    assert activation_bytes_per_layer(SMALL, PlanLayout(tp=2, **base)) == (2176 + 320) / 2
    # TP=2 without SP: sbh(10 + 24/t) + 5as^2b/t = 64*22 + 160
    no_sp = PlanLayout(tp=2, seq_parallel=False, **base)
    assert activation_bytes_per_layer(SMALL, no_sp) == 64 * 22 + 160
    # selective recompute drops the 5as^2b term; full keeps 2sbh (/t with SP)
    assert activation_bytes_per_layer(SMALL, PlanLayout(recompute="selective", **base)) == 2176
    assert activation_bytes_per_layer(SMALL, PlanLayout(recompute="full", **base)) == 128
    assert activation_bytes_per_layer(SMALL, PlanLayout(tp=2, recompute="full", **base)) == 64
    # context parallel 2: linear terms on s/2, scores 5*a*(s/2)*s*b
    assert activation_bytes_per_layer(SMALL, PlanLayout(cp=2, **base)) == 2176 / 2 + 160


def test_pipeline_in_flight_microbatches():
    # 8 layers, pp=4 -> 2 layers per stage, m=16
    one_f_one_b = PlanLayout(pp=4, microbatches=16)
    assert in_flight_layers(SMALL, one_f_one_b, stage=0) == 4 * 2  # p micro-batches
    assert in_flight_layers(SMALL, one_f_one_b, stage=3) == 1 * 2
    assert in_flight_layers(SMALL, PlanLayout(pp=4, microbatches=16, schedule="gpipe")) == 32
    inter = PlanLayout(pp=4, microbatches=16, schedule="interleaved", virtual_stages=2)
    assert in_flight_layers(SMALL, inter) == pytest.approx(8 * (1 + 3 / 8))
    assert in_flight_layers(SMALL, PlanLayout(pp=4, microbatches=2)) == 2 * 2  # min(p, m)


def test_70b_fits_check():
    llama, h100 = ModelSpec.llama("70b"), load_hardware("h100")
    ddp = memory_per_rank(llama, PlanLayout(dp_replicate=8))
    assert ddp.model_states == pytest.approx(16 * llama.params().total)
    assert not ddp.fits(h100)
    good = memory_per_rank(
        llama, PlanLayout(tp=8, pp=8, dp_shard=4, zero_stage=1, microbatches=32, recompute="selective")
    )
    assert good.fits(h100) and good.total < 60e9


def test_activations_counted_from_the_block_shape():
    """The paper's 34 term by term, and what changes for a gated, GQA, dropout-free block."""
    gpt = {t.name: t.sbh for t in saved_tensors(SMALL)}
    # norm inputs 4, QKV input 2, Q 2, K and V 4, projection input 2, MLP input 2,
    # fc1 output 8, GELU output 8, dropout masks 2 (Korthikanti et al. 2022, 4.1)
    assert gpt == {
        "norm inputs": 4,
        "attention input": 2,
        "Q": 2,
        "K, V": 4,
        "attention output": 2,
        "MLP input": 2,
        "fc1 output": 8,
        "activation output": 8,
        "dropout masks": 2,
    }
    assert saved_sbh(SMALL) == 34 and score_sbh(SMALL) == 5
    # SwiGLU at ffn = 4h keeps gate and up (16) and the down input (8); no dropout masks,
    # and eager keeps only the softmax output (2 a s / h): 4 + 2 + 2 + 4 + 2 + 2 + 16 + 8
    gated = ModelSpec(layers=8, hidden=8, heads=2, kv_heads=2, ffn=32, vocab=16, seq_len=4)
    assert saved_sbh(gated) == 40 and score_sbh(gated) == 2
    # grouped-query attention: K and V shrink to 4 * kv/a = 2
    gqa = ModelSpec(layers=8, hidden=8, heads=2, kv_heads=1, ffn=32, vocab=16, seq_len=4)
    assert saved_sbh(gqa) == 38
    # TP=2 without SP: norm inputs and the two block inputs stay whole (8), the other 32 / 2
    no_sp = PlanLayout(tp=2, seq_parallel=False, micro_batch_size=2)
    assert activation_bytes_per_layer(gated, no_sp) == 64 * (8 + 32 / 2)
    # MoE: each token's top_k = 2 experts keep their intermediates (24 each)
    moe = ModelSpec(layers=8, hidden=8, heads=2, kv_heads=2, ffn=32, vocab=16, seq_len=4, experts=4, top_k=2)
    assert saved_sbh(moe) == 16 + 2 * 24
