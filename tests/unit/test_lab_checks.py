"""Each lab checker's hints, fed the wrong answers students give (pure: no ranks, no kernel).

The measured values passed in are what the labs' 2-rank runs report (the instructor runs in
test_labs check them); here each wrong answer must name its mistake, not only "wrong".
"""

from __future__ import annotations

import pytest

import workbench.labs as labs
from workbench.labs import CheckFailed, checker, verdict

N_PARAMS = 34_976  # the tiny GPT of labs 01/02
W2 = [
    {
        "rank": r,
        "params": [
            {
                "name": "layers.0.feed_forward.w2.weight",
                "placements": ["Shard(dim=1)"],
                "global_shape": [32, 64],
                "local_shape": [32, 32],
            }
        ],
    }
    for r in range(2)
]


def hint(name, value, **measured) -> str:
    with pytest.raises(CheckFailed) as e:
        verdict(name, value, **measured)
    return str(e.value)


def test_a_right_answer_passes_and_prints_one_line(capsys):
    labs.check("lab_01.grad_bytes", N_PARAMS * 4, all_reduced_bytes=N_PARAMS * 4, n_params=N_PARAMS, world_size=2)
    assert (
        capsys.readouterr().out == "check passed: 139,904 bytes each way: every fp32 gradient, whatever the bucketing\n"
    )


def test_the_registry_refuses_a_second_checker_of_the_same_name():
    with pytest.raises(ValueError, match="already registered by workbench.labs.lab_03.w2_shard_dim"):

        @checker("lab_03.w2_shard_dim")
        def other(value):
            return "x"

    with pytest.raises(ValueError, match="use '<lab module>.<answer>'"):
        checker("no dot")
    with pytest.raises(LookupError, match="no checker 'lab_03.nope'; lab_03 has: lab_03.w1_local_shape"):
        verdict("lab_03.nope", 1)
    with pytest.raises(LookupError, match="no module workbench/labs/lab_99.py"):
        verdict("lab_99.x", 1)


def test_missing_measured_values_say_which_are_needed():
    with pytest.raises(TypeError, match="this check takes layouts=..., tensor=..."):
        verdict("lab_03.w2_shard_dim", 1)


def test_an_unanswered_blank_names_the_question():
    assert hint("lab_03.w2_shard_dim", ..., layouts=W2) == (
        "lab_03.w2_shard_dim: no answer yet: replace the `...` "
        "(Which dim of feed_forward.w2.weight ([dim, ffn_dim]) does tensor parallelism split?)"
    )


def test_lab_03_wrong_dim_and_shapes():
    assert "you sharded dim 0, the weight's output features: that is column-parallel" in hint(
        "lab_03.w2_shard_dim", 0, layouts=W2
    )
    assert verdict("lab_03.w2_shard_dim", -1, layouts=W2).startswith("check passed: w2 is Shard(1)")
    assert "dim 2 does not exist" in hint("lab_03.w2_shard_dim", 2, layouts=W2)
    assert "is the whole (global) tensor" in hint("lab_03.w2_local_shape", (32, 64), layouts=W2)
    assert "you divided dim 0 by 2, but the ranks split dim 1" in hint("lab_03.w2_local_shape", (16, 64), layouts=W2)
    assert "off by a factor of the world size 2" in hint("lab_03.w2_local_shape", (32, 16), layouts=W2)
    w1 = dict(local_shapes=[(32, 16), (32, 16)], full_shape=(64, 16))
    assert "transposed: nn.Linear stores its weight as [out_features, in_features]" in hint(
        "lab_03.w1_local_shape", (16, 32), **w1
    )
    assert "you divided dim 1 by 2, but the ranks split dim 0" in hint("lab_03.w1_local_shape", (64, 8), **w1)


def test_lab_01_world_size_bytes_and_ring_mistakes():
    assert "is the whole global batch" in hint("lab_01.local_batch", 8, local_batches=[4, 4], global_batch=8)
    m = dict(all_reduced_bytes=N_PARAMS * 4, n_params=N_PARAMS, world_size=2)
    assert "that is the number of parameters (elements); the gradients are fp32, 4 bytes each" in hint(
        "lab_01.grad_bytes", N_PARAMS, **m
    )
    assert "a factor of the world size" in hint("lab_01.grad_bytes", N_PARAMS * 8, **m)
    assert "off by about 10^3 (too large)" in hint("lab_01.grad_bytes", N_PARAMS * 4000, **m)
    r = dict(world_size=4, buffer_bytes=1000)
    assert "2B is the limit for many ranks" in hint("lab_01.ring_bytes_sent", 2000, **r)
    assert "only the reduce-scatter half" in hint("lab_01.ring_bytes_sent", 750, **r)
    assert "the sign is wrong" in hint("lab_01.ring_bytes_sent", -1500, **r)


def test_lab_02_bytes_per_parameter_and_sharding():
    d = dict(n_params=N_PARAMS, world_size=2)
    assert "that is the number of parameters" in hint("lab_02.ddp_bytes_per_rank", N_PARAMS, **d)
    # 8 of 16 bytes and "divided by the 2 ranks" are the same ratio on 2 ranks: both are named
    h = hint("lab_02.ddp_bytes_per_rank", 8 * N_PARAMS, **d)
    assert "leaves out AdamW's state" in h and "DDP shards nothing" in h
    f = dict(measured=8 * N_PARAMS, n_params=N_PARAMS, world_size=2)
    assert "is the unsharded (DDP) total; FSDP2 shards all of it over 2 ranks" in hint(
        "lab_02.fsdp2_bytes_per_rank", 16 * N_PARAMS, **f
    )
    assert "counts parameters, not bytes" in hint("lab_02.fsdp2_bytes_per_rank", N_PARAMS / 2, **f)


def test_lab_04_micro_batches_and_bubble():
    s = dict(micro_batches=4, batch=192, width=320, element_size=4, world_size=2)
    assert "that counts elements; each is 4 bytes" in hint("lab_04.send_bytes", 48 * 320, **s)
    assert "that is the whole batch of 192" in hint("lab_04.send_bytes", 192 * 320 * 4, **s)
    b = dict(stages=2, micro_batches=8)
    assert "(p-1)/m = 0.125 is the bubble relative to the compute time" in hint("lab_04.bubble_of_step", 0.125, **b)
    assert "that is the busy fraction" in hint("lab_04.bubble_of_step", 8 / 9, **b)


def test_lab_05_recompute_ratio():
    f = dict(heads=4, seq_len=64, hidden=64, formula={"none": 34.0, "selective": 20.0, "full": 2.0})
    assert "inverted" in hint("lab_05.full_over_none", 17.0, **f)
    assert "you kept the 5as/h score-matrix term" in hint("lab_05.full_over_none", 2 / (34 + 20), **f)
    # the lab's SwiGLU block keeps 32 s b h, not the paper's 34
    g = dict(heads=4, seq_len=64, hidden=64, formula={"none": 32.0, "selective": 32.0, "full": 2.0})
    assert "34sbh is the paper's GPT; this block keeps 32sbh" in hint("lab_05.full_over_none", 2 / 34, **g)


def test_lab_06_capacity_mistakes():
    c = dict(measured=160, capacity_factor=1.25, tokens=256, top_k=2, experts=4, world_size=2)
    assert "each token takes top_k = 2 slots" in hint("lab_06.capacity", 80, **c)
    assert "left out the capacity factor" in hint("lab_06.capacity", 128, **c)
    assert "divide by the E = 4 experts" in hint("lab_06.capacity", 640, **c)
    assert verdict("lab_06.capacity", 160.0, **c) == "check passed: capacity 160 = ceil(1.25 x 256 x 2 / 4)"


def test_lab_07_units_and_formulas():
    states = 16 * 70.55e9
    assert "GiB vs GB" in hint("lab_07.ddp_gb", states / 1024**3, states_bytes=states)
    assert "count 16 bytes per parameter" in hint("lab_07.ddp_gb", 70.55, states_bytes=states)
    assert "answer True or False" in hint("lab_07.fits_on_h100", "no", gb=1128.9, memory_gb=80)
    assert "a factor of the world size" in hint("lab_07.zero3_gb", states / 1e9, planner_bytes=states / 256, ranks=256)
    # Llama-3-70B's block keeps 33.5 s b h (planner); the paper's GPT 34
    sel = dict(planner_bytes=33.5 * 8192 * 8192 / 8, tp=8, heads=64, seq_len=8192, hidden=8192)
    assert "drops the 5as/h score term" in hint("lab_07.selective_bytes", (34 + 5 * 64) * 8192 * 8192 / 8, **sel)
    assert "a factor of the world size" in hint("lab_07.selective_bytes", 33.5 * 8192 * 8192, **sel)
    assert "34 is the paper's GPT; this block keeps 33.5sbh" in hint("lab_07.selective_bytes", 34 * 8192 * 1024, **sel)
    assert verdict("lab_07.selective_bytes", 33.5 * 8192 * 1024, **sel) == (
        "check passed: 281.0 MB per layer (33.5sbh/t)"
    )
    assert "2B is the many-ranks limit" in hint("lab_07.ddp_send_gb", 4.0, ranks=8, grad_bytes=2e9)
