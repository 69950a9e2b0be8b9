"""Tier 1: StrategySpec parsing and validation (pure logic, no processes)."""

import dataclasses

import pytest

from workbench.models import GPTConfig, MoEConfig
from workbench.strategies.spec import SpecError, StrategySpec, spec_from_args

TINY = GPTConfig.tiny()


def test_defaults_and_frozen():
    s = StrategySpec()
    assert s.kind == "ddp" and s.dp_shard == -1 and s.zero_stage == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.kind = "tp"  # frozen
    with pytest.raises(TypeError):
        StrategySpec("ddp")  # keyword-only


@pytest.mark.parametrize(
    "text,expected",
    [
        ("fsdp2 tp=2 dtype=bf16", dict(kind="fsdp2_tp", tp=2, param_dtype="bf16")),
        ("fsdp2_tp --tp 2 --dtype bf16 --compile", dict(kind="fsdp2_tp", tp=2, param_dtype="bf16", compile=True)),
        ("zero3 offload", dict(kind="zero", zero_stage=3, cpu_offload=True)),
        ("pp --schedule 1f1b --mb=4", dict(kind="pp", pp_schedule="1f1b", pp_microbatches=4)),
        ("tp --no-sp", dict(kind="tp", sequence_parallel=False)),
        (
            "fsdp2 reshard=false ac=selective",
            dict(kind="fsdp2", reshard_after_forward=False, activation_checkpointing="selective"),
        ),
        ("fsdp --replicate 2", dict(kind="fsdp2", dp_replicate=2)),
        ("deepspeed stage=1", dict(kind="zero", zero_stage=1)),
    ],
)
def test_parse(text, expected):
    s = StrategySpec.parse(text)
    for k, v in expected.items():
        assert getattr(s, k) == v, (k, s)


def test_spec_from_args_matches_parse():
    assert spec_from_args(["fsdp2", "--tp", "2", "--dtype=bf16"]) == StrategySpec.parse("fsdp2 tp=2 dtype=bf16")


@pytest.mark.parametrize(
    "text,needle",
    [
        ("fsdp2 tpp=2", "did you mean 'tp'"),
        ("fsdp3", "unexpected word"),
        ("ddp dtype=fp8", "param_dtype='fp8' is not one of"),
        ("pp --schedule interleaved", "pp_schedule"),
        ("ddp tp=2", "no tp dimension"),
        ("tp --mb", "needs a value"),
        ("zero stage=4", "zero_stage=4"),
    ],
)
def test_parse_errors(text, needle):
    with pytest.raises(SpecError, match=None) as e:
        StrategySpec.parse(text)
    assert needle in str(e.value)


@pytest.mark.parametrize(
    "text,world,cfg,needle",
    [
        ("fsdp2_tp tp=3", 4, TINY, "sizes that fit: tp=1 x dp_shard=4, tp=2 x dp_shard=2, tp=4 x dp_shard=1"),
        ("fsdp2 replicate=3", 4, TINY, "use one of [1, 2, 4]"),
        ("fsdp2 replicate=2 dp_shard=4", 4, TINY, "sizes that fit"),
        ("tp tp=2", 4, TINY, "use tp=4"),
        ("tp", 8, TINY, "does not divide n_heads=4, n_kv_heads=2"),
        ("tp", 4, TINY, "n_kv_heads=2"),
        ("pp", 4, TINY, "use pp <= 2"),
        ("ddp dtype=fp16", 2, TINY, "not supported on CPU"),
        ("zero3 offload", 2, TINY, "cpu_offload=True on a CPU device"),
        ("ddp via=accelerate", 2, TINY, "needs CUDA"),
        ("pp compile", 2, TINY, "compile=True with pipeline"),
        ("ddp offload", 2, TINY, "cpu_offload=True is implemented for"),
        ("tp", 2, MoEConfig.tiny(), "sequence_parallel=False"),
        ("pp", 2, TINY.with_(tie_embeddings=True), "tie_embeddings"),
        ("ddp reduce=bf16", 2, TINY, "reduce_dtype"),
        ("zero dp_shard=2", 4, TINY, "dp_shard=-1"),
    ],
)
def test_validate_errors(text, world, cfg, needle):
    with pytest.raises(SpecError) as e:
        StrategySpec.parse(text).validate(world, cfg, device_type="cpu")
    assert needle in str(e.value), str(e.value)
    assert isinstance(e.value, ValueError)


def test_validate_resolves_sizes_and_mesh():
    s = StrategySpec.parse("fsdp2_tp tp=2").validate(4, TINY)
    assert (s.dp_shard, s.tp) == (2, 2)
    assert StrategySpec.parse("fsdp2_tp tp=2").mesh_plan(4).dim_names == ("dp_shard", "tp")
    assert StrategySpec.parse("tp").validate(2, TINY).tp == 2
    assert StrategySpec.parse("pp").validate(2, TINY).pp == 2
    assert StrategySpec.parse("fsdp2 replicate=2").mesh_plan(4).shape == (2, 2)
    assert StrategySpec.parse("ddp").mesh_plan(3).shape == (3,)
    assert StrategySpec.parse("pp").resolve(2).microbatches == 4
    # fp16 is fine on CUDA; cpu_offload too
    StrategySpec.parse("zero3 offload dtype=fp16").validate(2, TINY, device_type="cuda")


def test_every_kind_valid_at_world_size_1():
    for kind in ("none", "ddp", "fsdp2", "zero", "tp", "pp", "fsdp2_tp"):
        StrategySpec(kind=kind).validate(1, TINY)


def test_dict_roundtrip_and_describe():
    s = StrategySpec.parse("fsdp2_tp tp=2 dtype=bf16")
    assert StrategySpec.from_dict(s.to_dict()) == s
    assert s.describe(4) == "fsdp2_tp tp=2 param_dtype=bf16 | mesh dp_shard=2 x tp=2"
    with pytest.raises(SpecError, match="unknown StrategySpec field"):
        StrategySpec.from_dict({"kind": "ddp", "bogus": 1})
