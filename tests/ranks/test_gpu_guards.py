"""The CUDA path's guards, tested on CPU (no GPU can run here).

The backend/GPU decision and the mesh-device default are pure functions of what a GPU host
would report (visible GPU ids, the process group's backend): they are fed those values
directly, since this machine has no GPU to report them. The Accelerate clean-up runs for
real on live gloo ranks, with Accelerate's own code setting the environment it leaves behind.
"""

from __future__ import annotations

import os

import psutil
import pytest

from workbench.notebook.cluster.gpu_plan import GpuPlan, plan_gpus
from workbench.notebook.cluster.rankset import RankSet, RankSetConfig


# ---------------------------------------------------------------- backend and GPU pinning
def test_auto_refuses_more_ranks_than_gpus_with_one_message():
    with pytest.raises(ValueError) as e:
        plan_gpus("auto", 4, [0])
    assert str(e.value) == (
        "4 ranks but 1 GPU visible (NCCL needs one GPU per rank): use -n 1, or --backend gloo for CPU ranks"
    )
    with pytest.raises(ValueError, match="3 ranks but 2 GPUs visible.*use -n 2"):
        plan_gpus("nccl", 3, [0, 1])


def test_auto_is_nccl_with_one_gpu_per_rank_in_visible_order():
    # CUDA_VISIBLE_DEVICES=3,5,6 on a GPU host: ranks 0 and 1 get GPUs 3 and 5, never the same one
    assert plan_gpus("auto", 2, [3, 5, 6]) == GpuPlan("nccl", (3, 5))
    assert plan_gpus("auto", 1, [0]) == GpuPlan("nccl", (0,))
    assert plan_gpus("nccl", 2, [0, 1]) == GpuPlan("nccl", (0, 1))


def test_cpu_ranks_without_gpus_or_when_asked():
    assert plan_gpus("auto", 4, []) == GpuPlan("gloo", ())
    assert plan_gpus("gloo", 4, [0]) == GpuPlan("gloo", ())  # the explicit opt-in on a GPU host
    with pytest.raises(ValueError, match="--backend nccl needs GPUs and none are visible"):
        plan_gpus("nccl", 1, [])


def test_start_refuses_before_any_process(monkeypatch):
    """A host showing one GPU (through CUDA_VISIBLE_DEVICES, the variable a GPU host sets): -n 4 is
    refused by the config check, before the controller or any engine is started."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(ValueError, match="4 ranks but 1 GPU visible"):
        RankSet.start(RankSetConfig(n=4))
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before
    RankSetConfig(n=4, backend="gloo").validate()  # the opt-in passes the same check


# ---------------------------------------------------------------- device following
def test_mesh_device_follows_the_process_group():
    from workbench.strategies.prepare import mesh_device_for

    assert mesh_device_for("nccl") == "cuda"
    assert mesh_device_for("gloo") == "cpu"
    assert mesh_device_for(None) == "cpu"


# ---------------------------------------------------------------- Accelerate clean-up on a real rank
def leave_accelerate_env_then_prepare_ddp():
    """Accelerate's own FSDP helper writes its variables, as an fsdp2 strategy on CUDA does;
    the next prepare must start from none of them."""
    import torch
    from accelerate.utils.fsdp_utils import enable_fsdp_ram_efficient_loading
    from torch.nn.parallel import DistributedDataParallel

    from workbench.models import GPT, GPTConfig
    from workbench.strategies import prepare, reset_accelerate_state
    from workbench.strategies.accelerate_path import ACCELERATE_ENV

    enable_fsdp_ram_efficient_loading()
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    before = sorted(k for k in ACCELERATE_ENV if k in os.environ)
    torch.manual_seed(0)
    p = prepare(GPT(GPTConfig.tiny()), lambda ps: torch.optim.AdamW(ps, lr=1e-3), "ddp")  # mesh device left out
    try:
        return {
            "before": before,
            "after": sorted(k for k in ACCELERATE_ENV if k in os.environ),
            "wrapper": type(p.model).__name__ if isinstance(p.model, DistributedDataParallel) else repr(type(p.model)),
            "param_device": next(p.unwrap().parameters()).device.type,
        }
    finally:
        p.close()
        reset_accelerate_state()


def test_switch_clears_accelerate_env_on_real_ranks(ranks2):
    for r in ranks2.apply(leave_accelerate_env_then_prepare_ddp):
        assert r["before"] == ["ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING"]
        assert r["after"] == []
        assert r["wrapper"] == "DistributedDataParallel"
        assert r["param_device"] == "cpu"  # gloo ranks: the default mesh device is the CPU


def test_nccl_status_line():
    """What ``%distrain status`` shows for NCCL ranks, and for ranks started with ``--nccl``
    settings (a CPU torch has no NCCL: said so)."""
    from workbench.engine.runtime import nccl_settings

    env = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}
    assert nccl_settings(env, "2.27.5") == "NCCL 2.27.5; NCCL_DEBUG=INFO NCCL_SOCKET_IFNAME=eth0"
    assert nccl_settings({}, None) == "no NCCL in this torch; no NCCL_* set"


def test_gloo_status_has_no_nccl_column(ranks2):
    assert all("nccl" not in row for row in ranks2.status())
