"""The GPU check's parts that run without a GPU: the wheel list and the report on a CPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "gpu"))

import wheels  # noqa: E402


def test_wheel_list_is_the_closure_the_device_lacks():
    """Every requirement of a listed wheel (CPython 3.12, Linux) is listed or on the device; no
    listed wheel is on the device; the workbench's own rank/test needs are all covered."""
    listed, have = wheels.missing(), wheels.on_device()
    assert {"ipyparallel", "ipython", "ipykernel", "pyzmq", "tornado", "traitlets", "deepspeed"} <= set(listed)
    assert not set(listed) & have
    assert {"torch", "accelerate", "transformers", "pandas", "psutil", "pyarrow", "mpi4py", "pytest"} <= have
    for name in listed:
        for req in wheels.requires(name):
            assert req in listed or req in have, f"{name} needs {req}: neither listed nor on the device"
    for name in wheels.NEEDED:
        assert wheels.norm(name) in listed or wheels.norm(name) in have


def test_gpu_check_on_cpu_skips_and_reports_no_cuda(tmp_path):
    env = dict(os.environ, GPU_CHECK_OUT=str(tmp_path), GPU_CHECK_TESTS="tests/gpu/test_strategies_gpu.py")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "gpu", "check.py")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["cuda"] is False and report["result"] == "no CUDA"
    assert report["tests"]["tests"] == report["tests"]["skipped"] > 0 and report["tests"]["failures"] == 0
    log = (tmp_path / "gpu_check.log").read_text()
    assert "needs a CUDA GPU" in log
    # the benchmark ran, said so, and wrote no figure
    assert report["benchmark"]["result"] == "no CUDA"
    assert "no CUDA GPU on this machine: nothing measured" in log
    assert not list(tmp_path.glob("gpu-*.json"))
