"""Uneven pipeline stages: the layer assignment, what each stage keeps in flight, the
bubble and the stage imbalance, against numbers worked by hand."""

from __future__ import annotations

import pytest

from workbench.planner import ModelSpec, PlanLayout, memory_per_rank, plan, plan_from_args
from workbench.planner.compute import stage_imbalance
from workbench.planner.memory import params_on_stage
from workbench.planner.pipeline import assignment_bubble, balanced_layers, chunk_layers, in_flight_layers, rank_layers

LLAMA405 = ModelSpec.llama("405b")
EIGHT = ModelSpec(layers=8, hidden=8, heads=2, kv_heads=2, ffn=32, vocab=16, seq_len=4)


def test_balanced_split_counts_embedding_and_head_as_a_layer_each():
    # torchtitan: 126 + 2 units over 16 stages = 8 each; the first and last give one
    # layer up for the embedding and the head -> Llama 3's 7, 8 x 14, 7
    assert balanced_layers(126, 16) == (7,) + (8,) * 14 + (7,)
    # 128 chunks (pp 16 x v 8): one unit each; the first chunk is the embedding alone
    # and the last the head alone (Llama 3, section 3.3.2)
    chunks = balanced_layers(126, 128)
    assert chunks[0] == 0 and chunks[-1] == 0 and set(chunks[1:-1]) == {1}
    # 80 + 2 = 82 over 8: 10 each, the first two chunks take the remainder of 2
    assert balanced_layers(80, 8) == (10, 11, 10, 10, 10, 10, 10, 9)
    # more chunks than layers + 2 would need negative counts: plain even split instead
    assert balanced_layers(3, 4) == (1, 1, 1, 0)


def test_126_layers_on_16_stages_plan_with_1f1b_and_interleaved():
    one_f = PlanLayout(tp=8, pp=16, dp_shard=8, zero_stage=1, microbatches=32)
    assert rank_layers(LLAMA405, one_f) == (7,) + (8,) * 14 + (7,)  # not divisible: balanced
    inter = PlanLayout(tp=8, pp=16, dp_shard=8, zero_stage=1, microbatches=32, schedule="interleaved", virtual_stages=2)
    # 32 chunks of 128 units: 4 each; chunk 0 and chunk 31 give one up
    chunks = chunk_layers(LLAMA405, inter)
    assert chunks[0] == 3 and chunks[31] == 3 and chunks[1:31] == (4,) * 30
    assert rank_layers(LLAMA405, inter) == (7,) + (8,) * 14 + (7,)  # rank r: chunks r, r+16
    p = plan(LLAMA405, inter, "h100")
    assert "layers per pipeline rank: 7, 8 x 14, 7" in p.summary()
    assert p.layout.layers_per_stage(LLAMA405) == 8


def test_even_split_when_layers_divide_and_balanced_on_request():
    assert rank_layers(EIGHT, PlanLayout(pp=4, microbatches=4)) == (2, 2, 2, 2)
    # 8 + 2 = 10 units over 4 stages: 3, 3, 2, 2 units -> 2, 3, 2, 1 layers
    balanced = PlanLayout(pp=4, microbatches=4, stage_layers="balanced")
    assert rank_layers(EIGHT, balanced) == (2, 3, 2, 1)


def test_given_counts_per_rank_and_per_chunk():
    per_rank = PlanLayout(pp=4, microbatches=8, stage_layers=(3, 2, 2, 1))
    assert rank_layers(EIGHT, per_rank) == (3, 2, 2, 1)
    # per rank with v = 2: each rank's count dealt over its two chunks (larger first)
    inter = PlanLayout(pp=2, microbatches=4, schedule="interleaved", virtual_stages=2, stage_layers=(5, 3))
    assert chunk_layers(EIGHT, inter) == (3, 2, 2, 1)  # chunks 0, 2 on rank 0; 1, 3 on rank 1
    per_chunk = PlanLayout(pp=2, microbatches=4, schedule="interleaved", virtual_stages=2, stage_layers=[0, 2, 3, 3])
    assert per_chunk.stage_layers == (0, 2, 3, 3)  # a list is kept as a tuple
    assert rank_layers(EIGHT, per_chunk) == (3, 5)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(pp=4, stage_layers=(2, 2, 2)), r"has 3 entries: give one per pipeline rank \(4\)"),
        (dict(pp=2, stage_layers=(0, 8)), "leaves pipeline rank 0 without a transformer layer"),
        (dict(stage_layers=(8,)), "needs pp >= 2"),
        (dict(pp=2, stage_layers=(4, -1)), "counts must be ints >= 0"),
        (dict(pp=2, stage_layers="uneven"), "give layer counts per stage"),
    ],
)
def test_stage_layer_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PlanLayout(**kwargs)


def test_stage_layers_must_add_up_to_the_model():
    with pytest.raises(ValueError, match=r"add up to 7 but the model has layers=8"):
        PlanLayout(pp=2, stage_layers=(4, 3)).validate_for(EIGHT)


def test_in_flight_follows_the_real_assignment():
    # 1F1B: stage r keeps min(p - r, m) micro-batches of ITS layers
    uneven = PlanLayout(pp=4, microbatches=8, stage_layers=(3, 2, 2, 1))
    assert in_flight_layers(EIGHT, uneven, 0) == 4 * 3
    assert in_flight_layers(EIGHT, uneven, 1) == 3 * 2
    assert in_flight_layers(EIGHT, uneven, 3) == 1 * 1
    # interleaved, p=2, v=2, m=4, chunks (0, 2, 3, 3): rank 0 holds chunks 0 (0 layers)
    # and 2 (3 layers). Megatron's warm-up: 2(p-r-1) + (v-1)p + 1 = 5 forwards in the
    # order mb0,mb1 of chunk 0, mb0,mb1 of chunk 2, mb2 of chunk 0 -> 0+0+3+3+0 = 6
    inter = PlanLayout(pp=2, microbatches=4, schedule="interleaved", virtual_stages=2, stage_layers=(0, 2, 3, 3))
    assert in_flight_layers(EIGHT, inter, 0) == 6
    # rank 1 (chunks 1: 2 layers, 3: 3 layers): 0 + 2 + 1 = 3 forwards: 2 + 2 + 3 = 7
    assert in_flight_layers(EIGHT, inter, 1) == 7
    # even chunks reproduce Korthikanti et al.'s L (1 + (p-1)/(p v)) on the first stage
    even = PlanLayout(pp=4, microbatches=16, schedule="interleaved", virtual_stages=2)
    assert in_flight_layers(EIGHT, even, 0) == pytest.approx(8 * (1 + 3 / 8))
    # m = p: every forward is in flight before the first backward (Megatron's all-warmup)
    llama = PlanLayout(
        tp=8,
        pp=16,
        dp_shard=128,
        zero_stage=2,
        microbatches=16,
        schedule="interleaved",
        virtual_stages=8,
        stage_layers="balanced",
    )
    assert in_flight_layers(LLAMA405, llama, 0) == 16 * 7
    assert in_flight_layers(LLAMA405, llama, 1) == 16 * 8


def test_bubble_follows_the_real_assignment():
    # even stages: Narayanan et al.'s (p-1)/m and (p-1)/(m v)
    assert assignment_bubble(EIGHT, PlanLayout(pp=4, microbatches=8)) == 3 / 8
    inter = PlanLayout(pp=4, microbatches=8, schedule="interleaved", virtual_stages=2)
    assert assignment_bubble(EIGHT, inter) == 3 / 16
    # uneven (3, 2, 2, 1): the busiest rank (3 layers) waits for the other 5 layers
    uneven = PlanLayout(pp=4, microbatches=8, stage_layers=(3, 2, 2, 1))
    assert assignment_bubble(EIGHT, uneven) == 5 / (8 * 3)
    # Llama 3 405B, 16 stages of (7, 8 x 14, 7), v = 8, m = 16: 118 / (8 * 16 * 8)
    llama = PlanLayout(
        tp=8,
        pp=16,
        dp_shard=128,
        zero_stage=2,
        microbatches=16,
        schedule="interleaved",
        virtual_stages=8,
        stage_layers="balanced",
    )
    assert assignment_bubble(LLAMA405, llama) == 118 / 1024


def test_stage_imbalance_counts_the_head_on_the_last_stage():
    uneven = PlanLayout(pp=4, microbatches=8, stage_layers=(3, 2, 2, 1))
    # work per rank with a layer = 1 s and the head = 0.5 s: 3, 2, 2, 1.5 -> 3 / 2.125
    assert stage_imbalance(EIGHT, uneven, 1.0, 0.5) == pytest.approx(3 / 2.125 - 1)
    assert stage_imbalance(EIGHT, PlanLayout(), 1.0, 0.5) == 0.0
    p = plan(EIGHT, uneven, "h100")
    c = p.compute
    assert c.compute_seconds == pytest.approx((c.matmul_seconds + c.attention_seconds) * (1 + c.imbalance))
    assert c.step_seconds == pytest.approx(c.compute_seconds * (1 + 5 / 24) + c.exposed_comm_seconds)


def test_model_states_follow_the_assignment():
    uneven = PlanLayout(pp=4, microbatches=8, stage_layers=(3, 2, 2, 1))
    per_layer = EIGHT.attention_params_per_layer() + EIGHT.mlp_params_per_expert() + 2 * EIGHT.hidden
    embedding = EIGHT.vocab * EIGHT.hidden
    held = [sum(params_on_stage(EIGHT, uneven, stage)) for stage in range(4)]
    assert held == [3 * per_layer + embedding, 2 * per_layer, 2 * per_layer, 1 * per_layer + embedding + EIGHT.hidden]
    # the busiest stage is found among all stages, not only the first and the last
    middle = PlanLayout(pp=4, microbatches=1, stage_layers=(1, 5, 1, 1))
    assert memory_per_rank(EIGHT, middle).stage == 1


def test_magic_flags_for_stages():
    p = plan_from_args(
        "--model 405b --hw h100 --gpus 16384 --tp 8 --pp 16 --dp 128 --zero 2 "
        "-m 16 --schedule interleaved --virtual-stages 8 --stages 7,8*14,7"
    )
    assert rank_layers(LLAMA405, p.layout) == (7,) + (8,) * 14 + (7,)
    assert "stages=7,8*14,7" in p.summary()
    balanced = plan_from_args(
        "--model 405b --hw h100 --tp 8 --pp 16 --dp 128 --zero 2 -m 16 --layers-per-stage balanced"
    )
    assert balanced.layout.stage_layers == "balanced"
    # a different assignment changes the result
    other = plan_from_args("--model 405b --hw h100 --tp 8 --pp 16 --dp 128 --zero 2 -m 16 --stages 6,9,8*13,7")
    assert other.memory.total > balanced.memory.total
    assert other.compute.imbalance > balanced.compute.imbalance
    assert other.compute.step_seconds > balanced.compute.step_seconds
    for argv, message in [
        ("--model 405b --hw h100 --stages 8*16", "give --pp N"),
        ("--model 405b --hw h100 --pp 16 --stages 8*16", "add up to 128 but the model"),
        ("--model 405b --hw h100 --pp 16 --stages 8*15", "has 15 entries"),
        ("--model 405b --hw h100 --pp 16 --stages some", "expected 'balanced' or layer counts"),
    ]:
        with pytest.raises(ValueError, match=message):
            plan_from_args(argv)
