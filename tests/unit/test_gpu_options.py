"""The GPU features' guards, pure: fp8, CUDA graphs, ZeRO-Infinity / ZeRO++ options of the
spec and the DeepSpeed configuration they make, and ``--nccl`` / ``--nccl-preset`` settings.
What runs them is tested on CPU ranks (tests/ranks/test_fp8_nccl_ranks.py) and on a GPU
(tests/gpu/test_gpu_features.py)."""

import pytest

from workbench.shared.nccl import NCCL_PRESETS, NcclError, nccl_env
from workbench.strategies.accelerate_path import choose_path
from workbench.strategies.spec import SpecError, StrategySpec
from workbench.strategies.zero import deepspeed_config


def refused(text: str, world: int = 4, device: str = "cpu") -> str:
    with pytest.raises(SpecError) as e:
        StrategySpec.parse(text).validate(world, device_type=device)
    return str(e.value)


# ---------------------------------------------------------------------------------- fp8
def test_fp8_parses_and_validates_where_it_can_run():
    s = StrategySpec.parse("fsdp2 fp8=rowwise dtype=bf16").validate(4, device_type="cuda")
    assert (s.fp8, s.fp8_emulate, s.param_dtype) == ("rowwise", False, "bf16")
    s = StrategySpec.parse("fsdp2 tp=2 fp8=tensorwise fp8_emulate=true").validate(4)
    assert (s.kind, s.tp, s.fp8, s.fp8_emulate) == ("fsdp2_tp", 2, "tensorwise", True)


def test_fp8_refusals_name_what_would_work():
    assert refused("fsdp2 fp8=rowwise") == (
        "fp8='rowwise' on CPU: fp8 matmuls need CUDA with SM >= 8.9; add fp8_emulate=true for fp8 numerics "
        "(torchao's emulation, no speed-up), or run on a GPU"
    )
    assert "fp8='tensorwise' with pp is not wired here" in refused("pp=2 fp8=tensorwise fp8_emulate=true")
    assert "fp8='rowwise' with zero is not wired here" in refused("zero fp8=rowwise fp8_emulate=true")
    assert "is not one of ['none', 'tensorwise', 'rowwise'] (did you mean 'rowwise'?)" in refused("fsdp2 fp8=rowwis")
    assert refused("fsdp2 fp8_emulate=true").startswith("fp8_emulate=true without fp8")
    assert "with via='accelerate'" in refused("fsdp2 fp8=rowwise via=accelerate", device="cuda")


def test_fp8_and_cuda_graphs_take_the_native_path_on_cuda():
    assert choose_path(StrategySpec.parse("fsdp2").resolve(4), "cuda")[0] == "accelerate"
    assert choose_path(StrategySpec.parse("fsdp2 fp8=rowwise").resolve(4), "cuda")[0] == "native"
    assert choose_path(StrategySpec.parse("ddp cuda_graphs=true").resolve(4), "cuda")[0] == "native"


# ---------------------------------------------------------------------------- CUDA graphs
def test_compile_reduce_overhead_means_cuda_graphs():
    s = StrategySpec.parse("none compile=reduce-overhead")
    assert s.cuda_graphs is True and s.compile is False
    assert s.validate(1, device_type="cuda").cuda_graphs


def test_cuda_graphs_refusals():
    assert refused("ddp compile=reduce-overhead") == (
        "cuda_graphs=true on CPU: CUDA graphs need CUDA ranks; drop it (or compile=true for inductor)"
    )
    assert "cuda_graphs=true with kind='fsdp2'" in refused("fsdp2 cuda_graphs=true", device="cuda")
    assert "drop compile=true" in refused("ddp cuda_graphs=true compile=true", device="cuda")
    assert "activation checkpointing" in refused("ddp cuda_graphs=true ac=full", device="cuda")


# ---------------------------------------------------------------- ZeRO-Infinity / ZeRO++
def test_zero_infinity_and_zero_plus_plus_make_deepspeeds_configuration():
    s = StrategySpec.parse(
        "zero stage=3 offload_param=nvme offload_optimizer=nvme nvme_path=/mnt/NVMe0/swap "
        "nvme_buffer_count=6 nvme_buffer_size=50000000 nvme_max_in_cpu=0 quantized_weights=true "
        "quantized_gradients=true hpz=2"
    ).validate(4, device_type="cuda")
    assert s.nvme_path == "/mnt/NVMe0/swap"  # a folder keeps its case
    z = deepspeed_config(s, world_size=4)["zero_optimization"]
    assert z["offload_param"] == {
        "device": "nvme",
        "pin_memory": True,
        "nvme_path": "/mnt/NVMe0/swap",
        "buffer_count": 6,
        "buffer_size": 50000000,
        "max_in_cpu": 0,
    }
    assert z["offload_optimizer"] == {
        "device": "nvme",
        "pin_memory": True,
        "nvme_path": "/mnt/NVMe0/swap",
        "buffer_count": 4,
    }
    assert z["zero_quantized_weights"] and z["zero_quantized_gradients"] and z["zero_hpz_partition_size"] == 2
    assert deepspeed_config(s, world_size=4)["aio"]["block_size"] == 1048576
    # the caller's torch optimizer steps the offloaded partitions (not DeepSpeed's CPU Adam op)
    assert deepspeed_config(s, world_size=4)["zero_force_ds_cpu_optimizer"] is False
    plain = deepspeed_config(StrategySpec.parse("zero stage=3").resolve(4), world_size=4)
    assert "aio" not in plain and not {"offload_param", "zero_quantized_weights"} & set(plain["zero_optimization"])
    assert "zero_force_ds_cpu_optimizer" not in plain
    # Accelerate's DeepSpeed plugin does not carry these: the engine is built directly
    assert choose_path(s, "cuda")[0] == "deepspeed"


def test_zero_option_refusals():
    assert refused("zero stage=3 offload_param=nvme", device="cuda") == (
        "offload_param=nvme needs nvme_path=FOLDER (on a fast local disk); or offload to cpu"
    )
    assert refused("zero stage=2 offload_optimizer=nvme nvme_path=/x", device="cuda") == (
        "offload_optimizer needs ZeRO stage 3 (partitioned parameters), not stage 2; use 'zero stage=3 ...'"
    )
    assert "nothing offloaded to it" in refused("zero stage=3 nvme_path=/x", device="cuda")
    assert refused("zero stage=3 offload_optimizer=nvme nvme_path=/x nvme_max_in_cpu=0") == (
        "nvme_max_in_cpu is how many parameter elements offload_param=nvme keeps in memory: "
        "add offload_param=nvme, or drop it"
    )
    assert "parameter elements kept in memory, 0 or more" in refused(
        "zero stage=3 offload_param=nvme nvme_path=/x nvme_max_in_cpu=-1"
    )
    assert refused("fsdp2 nvme_max_in_cpu=0").startswith("nvme_max_in_cpu is a DeepSpeed ZeRO option")
    assert refused("fsdp2 hpz=2") == "hpz is a DeepSpeed ZeRO option; use 'zero stage=3 ...', or drop it"
    assert "hpz=3 must divide the 4 ZeRO ranks" in refused("zero stage=3 hpz=3", device="cuda")
    assert "ZeRO++'s quantizer kernels are CUDA only" in refused("zero stage=3 quantized_weights=true")
    assert "hierarchical partitioning is built for CUDA ranks" in refused("zero stage=3 hpz=2")
    # NVMe offload runs on CPU ranks too (tests/ranks/test_zero_nvme.py); cpu offload there is refused
    cpu = StrategySpec.parse("zero stage=3 offload_param=nvme offload_optimizer=nvme nvme_path=/x").validate(4)
    assert (cpu.offload_param, cpu.offload_optimizer) == ("nvme", "nvme")
    assert "the state already lives in host memory" in refused("zero stage=3 offload_optimizer=cpu")
    assert "cpu_offload=true with offload_param/offload_optimizer" in refused(
        "zero stage=3 cpu_offload=true offload_param=cpu", device="cuda"
    )


# ---------------------------------------------------------------------------------- NCCL
def test_nccl_settings_parse_with_lists_prefixes_and_presets():
    env = nccl_env("ALGO=Ring,Tree,PROTO=Simple NCCL_BUFFSIZE=8388608", None)
    assert env == {"NCCL_ALGO": "Ring,Tree", "NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "8388608"}
    env = nccl_env("IB_TIMEOUT=20", "roce")  # a setting beside a preset overrides its entry
    assert env == {**{f"NCCL_{k}": v for k, v in NCCL_PRESETS["roce"].items()}, "NCCL_IB_TIMEOUT": "20"}
    assert nccl_env("PROTO=^LL128", "nvl72")["NCCL_NVLS_ENABLE"] == "1"
    assert nccl_env(None, None) == {}


@pytest.mark.parametrize(
    "text, preset, message",
    [
        ("ALOG=Ring", None, "--nccl: unknown setting 'ALOG' (did you mean NCCL_ALGO?)"),
        (
            "PROTO=Fast",
            None,
            "--nccl NCCL_PROTO='Fast': NCCL expects one of LL, LL128, Simple (a comma list, ^ to exclude)",
        ),
        ("BUFFSIZE=1k", None, "--nccl NCCL_BUFFSIZE='1k': NCCL expects an integer >= 65536"),
        ("NVLS_ENABLE=2", None, "--nccl NCCL_NVLS_ENABLE='2': NCCL expects an integer 0..1"),
        ("Ring", None, "--nccl 'Ring': expected NAME=VALUE pairs, e.g. ALGO=Ring,PROTO=Simple"),
        ("MIN_NCHANNELS=8,MAX_NCHANNELS=4", None, "--nccl MIN_NCHANNELS=8 is above MAX_NCHANNELS=4"),
        (
            "NSOCKS_PERTHREAD=16,SOCKET_NTHREADS=8",
            None,
            "NSOCKS_PERTHREAD x SOCKET_NTHREADS = 128: NCCL allows at most 64",
        ),
        (None, "efa", "--nccl-preset 'efa' is not one of ib, roce, nvl72"),
    ],
)
def test_a_bad_nccl_setting_is_refused_with_one_message(text, preset, message):
    with pytest.raises(NcclError) as e:
        nccl_env(text, preset)
    assert message in str(e.value)


# ------------------------------------------------------------------- planner: NVMe offload
def test_the_planner_counts_nvme_offload_against_the_disks_bandwidth():
    from workbench.planner import ModelSpec, PlanLayout, plan, plan_from_args
    from workbench.planner.compute import nvme_seconds

    model = ModelSpec.llama("70b")
    cpu = plan(model, PlanLayout(dp_shard=8, zero_stage=3, optimizer_offload=True), "h100")
    nvme = plan(model, PlanLayout(dp_shard=8, zero_stage=3, optimizer_offload=True, nvme_gbs=6.0), "h100")
    # the optimizer shard's 12 bytes a parameter read and written back at 6 GB/s, on top of the host link
    shard_params = cpu.memory.cpu_offload / 12
    extra = nvme.compute.offload_seconds - cpu.compute.offload_seconds
    assert extra == pytest.approx(2 * shard_params * 12 / 6e9) == pytest.approx(nvme_seconds(shard_params, 6e9))
    assert nvme.compute.step_seconds > cpu.compute.step_seconds
    assert nvme.memory.total == cpu.memory.total  # off the GPU either way
    assert "offload=nvme(6 GB/s)" in nvme.layout.describe() and "(nvme 6 GB/s)" in nvme.summary()
    from_flags = plan_from_args("--model llama-70b --gpus 8 --zero 3 --nvme 6 --hardware h100")
    assert from_flags.layout.nvme_gbs == 6.0 and from_flags.layout.optimizer_offload
    with pytest.raises(ValueError, match="needs optimizer_offload=True"):
        PlanLayout(dp_shard=8, zero_stage=3, nvme_gbs=6.0)


def test_deepspeeds_op_builds_use_the_ninja_installed_beside_it(monkeypatch):
    """A kernel started without its environment activated: the environment's bin goes first on
    PATH (once), so DeepSpeed's JIT builds run the ninja pip installed with it, not another one
    whose build log makes every build start over."""
    import os
    import sys

    from workbench.strategies.zero import ninja_beside_python

    here = os.path.dirname(sys.executable)
    assert os.access(os.path.join(here, "ninja"), os.X_OK)  # deepspeed's dependency, in this venv
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", here, "/bin"]))
    ninja_beside_python()
    assert os.environ["PATH"].split(os.pathsep) == [here, "/usr/bin", "/bin"]
    ninja_beside_python()
    assert os.environ["PATH"].split(os.pathsep) == [here, "/usr/bin", "/bin"]
