"""recommend(), Plan.summary()/to_frame(), plan_from_args() and the hardware catalogue."""

from __future__ import annotations

import pytest

from workbench.planner import HARDWARE, ModelSpec, PlanLayout, load_hardware, plan, plan_from_args, recommend
from workbench.planner.recommend import as_frame

LLAMA70 = ModelSpec.llama("70b")


def test_catalogue_has_the_listed_parts_as_data():
    for key in ("h100", "h200", "b200", "gb200-nvl72", "mi300x", "mi325x", "gaudi3", "tpu-v5p", "trainium2"):
        hw = HARDWARE[key]
        assert hw.memory_gb > 0 and hw.bf16_tflops > 0 and hw.fp8_tflops >= hw.bf16_tflops
        assert hw.inter_node_gbs < hw.intra_node_gbs and hw.devices_per_node >= 4
        low, high = hw.price_usd_per_hour
        assert 0 < low < high
    assert HARDWARE["h100"].price_usd_per_hour == (1.99, 3.5)
    assert HARDWARE["b200"].price_usd_per_hour == (4.5, 6.5)
    assert HARDWARE["mi300x"].price_usd_per_hour == (1.7, 2.8)
    assert load_hardware("H100-SXM") is HARDWARE["h100"]
    assert load_hardware("v5p") is HARDWARE["tpu-v5p"]
    # HBM is sold in binary units: an "80GB" H100 holds 80 GiB; the 90% rule applies to that
    assert HARDWARE["h100"].memory_bytes == 80 * 2**30 == 85_899_345_920


def test_unknown_hardware_lists_known_names():
    with pytest.raises(ValueError, match=r"unknown hardware 'a100'; known: h100, h200, b200"):
        load_hardware("a100")


def test_recommend_returns_only_fitting_layouts_with_tp_in_node():
    h100 = load_hardware("h100")
    recs = recommend(LLAMA70, 256, h100, top=8)
    assert len(recs) == 8
    steps = [r.plan.compute.step_seconds for r in recs]
    assert steps == sorted(steps)
    for r in recs:
        assert r.plan.fits and r.plan.memory.total <= 0.9 * 80 * 2**30  # an "80GB" H100 holds 80 GiB
        assert r.layout.world_size == 256
        assert 1 < r.layout.tp <= h100.devices_per_node
        assert "TP within a node" in r.reason
    zero_needed = [r for r in recs if "needed: model states 1.1 TB" in r.reason]
    assert zero_needed, [r.reason for r in recs]
    frame = as_frame(recs)
    assert list(frame["tp"]) == [r.layout.tp for r in recs]


def test_recommend_prefers_in_node_tp_over_cross_node():
    # Trainium2 has 16 chips per node: TP=32 would cross nodes and is never proposed
    trn = load_hardware("trainium2")
    recs = recommend(ModelSpec.llama("8b"), 32, trn, top=20)
    assert all(r.layout.tp <= trn.devices_per_node for r in recs)
    # the cross-node TP layout is slower than the in-node one for the same memory
    inter = plan(
        LLAMA70, PlanLayout(tp=16, pp=4, dp_shard=4, zero_stage=1, microbatches=32, recompute="selective"), "h100"
    )
    intra = plan(
        LLAMA70, PlanLayout(tp=8, pp=8, dp_shard=4, zero_stage=1, microbatches=32, recompute="selective"), "h100"
    )
    assert intra.compute.step_seconds < inter.compute.step_seconds
    assert any("spans nodes" in w for w in inter.warnings)


def test_recommend_says_when_nothing_fits():
    with pytest.raises(ValueError, match="no layout of 8 x h100 fits llama3-70b"):
        recommend(LLAMA70, 8, "h100")


def test_plan_summary_and_frame():
    p = plan(
        LLAMA70,
        PlanLayout(tp=8, pp=8, dp_shard=4, zero_stage=1, microbatches=128, recompute="selective"),
        "h100",
        tokens=1e12,
        price=3,
    )
    text = p.summary()
    for needle in (
        "memory per GPU",
        "optimizer",
        "activations",
        "reduce_scatter",
        "send_recv",
        "bubble: 5.5%",
        "MFU:",
        "cost: 256 GPUs",
        "USD",
    ):
        assert needle in text, needle
    frame = p.to_frame()
    assert set(frame.columns) == {"section", "item", "value", "unit"}
    total = frame.query("section == 'memory' and item == 'total'")["value"].item()
    assert total == pytest.approx(p.memory.total / 1e9)
    assert p.cost.gpu_hours == pytest.approx(256 * 24 * p.cost.days)


def test_plan_from_args_matches_plan():
    p = plan_from_args(
        [
            "--model",
            "70b",
            "--gpus",
            "256",
            "--hw",
            "h100",
            "--tp",
            "8",
            "--pp",
            "8",
            "--dp",
            "4",
            "--zero",
            "1",
            "--recompute",
            "selective",
            "--tokens",
            "1e12",
            "--price",
            "3",
        ]
    )
    assert (
        p.layout.dp_shard == 4 and p.layout.zero_stage == 1 and p.layout.microbatches == 128
    )  # ~4M tokens / (dp 4 x 8192)
    assert p.tokens == 1e12 and p.cost.price_per_hour == 3
    ddp = plan_from_args("--model 8b --hw h100 --gpus 8")
    assert ddp.layout.dp_replicate == 8 and ddp.layout.zero_stage == 0
    fsdp = plan_from_args("--model 8b --hw h100 --gpus 8 --fsdp")
    assert fsdp.layout.dp_shard == 8 and fsdp.layout.zero_stage == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        ("--hw h100", "the following arguments are required: --model"),
        ("--model 70b --hw h100 --zero 5", "invalid choice"),
        ("--model 70b --hw h100 --tp 3", "tp=3 does not divide heads=64"),
        ("--model 70b --hw a100", "unknown hardware 'a100'"),
        ("--model 70b --hw h100 --gpus 256 --tp 8 --pp 8 --dp 8", "--gpus 256 but the layout"),
        ("--model 70b --hw h100 --bogus 1", "unrecognized arguments: --bogus"),
    ],
)
def test_plan_from_args_errors_are_one_line_with_usage(argv, message):
    with pytest.raises(ValueError) as err:
        plan_from_args(argv)
    text = str(err.value)
    assert message in text and "usage: %distrain plan" in text and "\n" not in text
