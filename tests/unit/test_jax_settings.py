"""`--framework jax` settings, refused before anything starts; lab 13's checkers; the planner's
bytes-per-rank comparison's refusals. Pure: no ranks (tests/ranks/test_jax_ranks.py has them)."""

from __future__ import annotations

import pytest

from workbench.engine.preload import own_framework
from workbench.labs import CheckFailed
from workbench.labs.lab_13 import check_fsdp_bytes, check_tp_collective, collective_name
from workbench.notebook.cluster import launchers
from workbench.notebook.cluster.rankset import RankSetConfig
from workbench.planner import ModelSpec, PlanLayout
from workbench.planner.sharded_bytes import compare_param_bytes, shape_config


def test_the_rank_process_reads_its_framework_and_passes_the_rest_to_ipengine():
    assert own_framework(["--ranks", "2"]) == ("torch", ["--ranks", "2"])
    assert own_framework(["--framework", "jax", "--ranks", "2"]) == ("jax", ["--ranks", "2"])
    with pytest.raises(SystemExit, match="--framework needs one of torch, jax"):
        own_framework(["--framework", "tf"])


def test_jax_engines_import_jax_not_torch():
    kwargs = launchers.cluster_kwargs("local", 2, framework="jax")
    cfg = kwargs["config"]
    assert "--IPEngine.startup_command=import jax, jax.numpy" in cfg.EngineLauncher.engine_args
    assert cfg.LocalEngineSetLauncher.engine_cmd[-2:] == ["--framework", "jax"]
    assert "import torch" in launchers.cluster_kwargs("local", 2)["config"].EngineLauncher.engine_args[0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"framework": "tf"}, r"--framework 'tf' is not known: use one of torch, jax"),
        ({"framework": "jax", "backend": "nccl"}, r"--backend nccl is torch's.*leave --backend out"),
        ({"framework": "jax", "launcher": "mpi"}, r"--framework jax starts its ranks with --launcher local"),
    ],
)
def test_bad_framework_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RankSetConfig(n=2, **kwargs).validate()


def test_collective_names_from_torch_and_hlo_agree():
    assert {collective_name(n) for n in ("all-reduce", "all_reduce", "c10d::allreduce")} == {"all-reduce"}
    assert collective_name("all_gather_into_tensor") == collective_name("all-gather") == "all-gather"
    assert collective_name("reduce_scatter_tensor") == "reduce-scatter"
    assert collective_name("wait_tensor") is None


def test_lab_13_checks_name_the_likely_mistake():
    torch_ops = {"all_gather_into_tensor": 4, "all_reduce": 5}
    jax_ops = {"all-reduce": 5}
    assert "all-reduce" in check_tp_collective("all_reduce", torch_ops=torch_ops, jax_ops=jax_ops)
    with pytest.raises(CheckFailed, match="all-gather is FSDP's"):
        check_tp_collective("all-gather", torch_ops=torch_ops, jax_ops=jax_ops)
    measured = {"torch_bytes": 4096, "jax_bytes": 4096, "total_bytes": 8192, "world": 2}
    assert "4,096 of the block's 8,192" in check_fsdp_bytes(4096, **measured)
    with pytest.raises(CheckFailed, match="you counted parameters"):
        check_fsdp_bytes(1024, **measured)
    with pytest.raises(CheckFailed, match="a factor of the world size"):
        check_fsdp_bytes(8192, **measured)
    with pytest.raises(CheckFailed, match="the two frameworks disagree"):
        check_fsdp_bytes(4096, **{**measured, "jax_bytes": 8192})


def test_planner_comparison_refuses_what_it_cannot_compare():
    model = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, seq_len=32)
    layout = {"rank": 0, "param_bytes_local": 1}
    with pytest.raises(ValueError, match="the plan is for 4 ranks and the layout came from 1"):
        compare_param_bytes([layout], model, PlanLayout(tp=4))
    with pytest.raises(ValueError, match="experts=1"):
        shape_config(ModelSpec(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256, seq_len=32, experts=4))
    assert shape_config(model) == {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 128, "vocab": 256}
