"""The GPU check's parts that run without a GPU: the wheel list, what the GPU tier imports, the
report on a CPU machine, the stage timeouts and the benchmark's time budget."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "gpu"))

import wheels  # noqa: E402


def _check_module():
    """``gpu/check.py`` as a module (stdlib only, nothing runs on import)."""
    spec = importlib.util.spec_from_file_location("gpu_check_script", os.path.join(ROOT, "gpu", "check.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_wheel_list_is_the_closure_the_device_lacks():
    """Every requirement of a listed wheel (CPython 3.12, Linux) is listed or on the device; no
    listed wheel is on the device; the workbench's own rank/test needs are all covered."""
    listed, have = wheels.missing(), wheels.on_device()
    assert {"ipyparallel", "ipython", "ipykernel", "pyzmq", "tornado", "traitlets", "deepspeed", "torchao"} <= set(
        listed
    )
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
    # the features benchmark ran too, said so, and wrote no figure
    assert report["features"]["result"] == "no CUDA"
    assert "gpu_features_bench: no CUDA GPU on this machine: nothing measured" in log
    assert set(report["stages_s"]) == {"wheels", "probe", "tests", "features", "benchmark"}
    assert report["wall_s"] < report["budget_s"]


# what the GPU tier, its spawned ranks and the benchmark import (the functions the tests run
# import inside their bodies: named here), then the distributions those modules come from.
# Hidden: packages that libraries import only where they are installed, which this venv has
# for other tiers and the GPU tier never needs: DeepSpeed's autotuner imports mlflow (installed
# for `%distrain track`), torch.utils.data imports dill (brought by `datasets`).
OPTIONAL_HERE = ("mlflow", "wandb", "tensorboard", "trackio", "dill")
_IMPORTS = textwrap.dedent(
    """
    import importlib, importlib.metadata, importlib.util, json, os, sys
    for hidden in os.environ["WORKBENCH_HIDDEN"].split(","):
        sys.modules[hidden] = None  # `import` fails, `find_spec` answers None: as where it is not installed
    root = sys.argv[1]
    sys.path[:0] = [root] + [os.path.join(root, s) for s in ("tests", "tests/gpu", "benchmarks")]
    spec = importlib.util.spec_from_file_location("conftest", os.path.join(root, "tests", "conftest.py"))
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    for name in sys.argv[2:]:
        importlib.import_module(name)
    # each imported module's own file, to the distribution that installed it (a namespace such
    # as `google` is shared by several distributions: the top-level name cannot tell which)
    # (the name read once per distribution: `dist.metadata` parses METADATA at each access)
    owner = {}
    for dist in importlib.metadata.distributions():
        dist_name = dist.metadata["Name"]
        for f in dist.files or []:
            if f.suffix in (".py", ".so", ".pyc"):
                owner[os.path.realpath(dist.locate_file(f))] = dist_name
    found = set()
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if module is None or not path or name.split(".")[0] in sys.stdlib_module_names:
            continue
        if os.path.realpath(path) in owner:
            found.add(owner[os.path.realpath(path)])
    print(json.dumps(sorted(found)))
    """
)
_MODULES = [
    "one_gpu",
    "gloo_harness",
    "test_checkpoint_gpu",
    "test_strategies_gpu",
    "test_telemetry_gpu",
    "test_gpu_features",
    "gpu_bench",
    "gpu_features_bench",
    "torchao.float8",
    "workbench.shared.nccl",
    "workbench.models",
    "workbench.strategies",
    "workbench.engine.runtime",
    "workbench.engine.trainer",
    "workbench.engine.checkpoint.save",
    "workbench.engine.checkpoint.load",
    "workbench.engine.checkpoint.state",
    "workbench.shared.checkpoint.catalog",
    "workbench.shared.checkpoint.integrity",
    "workbench.planner.flops",
    "workbench.planner.hardware",
    "accelerate.state",
    "deepspeed",
    "torch.distributed.fsdp",
]


def test_everything_the_gpu_tier_imports_is_on_the_device_or_among_the_wheels():
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", WORKBENCH_HIDDEN=",".join(OPTIONAL_HERE))
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORTS, ROOT, *_MODULES],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {wheels.norm(d) for d in json.loads(proc.stdout.strip().splitlines()[-1])}
    assert {
        "torch",
        "accelerate",
        "deepspeed",
        "torchao",
        "pydantic",
        "pytest",
    } <= found  # the import list did its work
    own = {"distrain-workbench"}
    missing = found - own - set(wheels.missing()) - wheels.on_device()
    assert not missing, f"imported by the GPU tier, neither on the GPU machine nor among the wheels: {missing}"


def test_a_stage_past_its_time_gets_sigint_then_its_whole_group_is_ended(tmp_path):
    """A stage (pytest, the benchmark) that overruns is interrupted (pytest then writes its
    report), and what it spawned cannot keep the GPU into the next stage."""
    check = _check_module()
    check.GRACE_S = 5
    pids, caught = tmp_path / "pids", tmp_path / "caught"
    script = textwrap.dedent(
        f"""
        import os, signal, subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{child.pid}}")
        try:
            time.sleep(600)
        except KeyboardInterrupt:
            open({str(caught)!r}, "w").write("interrupted")  # as pytest writes its junit XML
        """
    )
    # as under `nohup make gpu-check &`: the check starts with SIGINT ignored, which a stage
    # would inherit (and never see the interrupt)
    was = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with open(tmp_path / "log", "w") as log:
            t = time.monotonic()
            code = check.run([sys.executable, "-c", script], log, dict(os.environ), timeout=3)
            took = time.monotonic() - t
    finally:
        signal.signal(signal.SIGINT, was)
    assert code == 124
    assert caught.read_text() == "interrupted"
    assert took < 3 + check.GRACE_S + 10
    parent, child = map(int, pids.read_text().split())

    def ended(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    # the child ignored SIGINT: ended by the group's SIGKILL (the kernel takes a moment to tear it down)
    deadline = time.monotonic() + 5
    while not (ended(parent) and ended(child)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ended(parent) and ended(child), (parent, child)
    text = (tmp_path / "log").read_text()
    assert "timed out after 3 s: SIGINT" in text and "killed processes left behind" in text


def test_the_report_is_written_when_the_check_itself_breaks(tmp_path, monkeypatch):
    check = _check_module()
    monkeypatch.setenv("GPU_CHECK_OUT", str(tmp_path))

    def broken(out, report, env, log, t0):
        report["stages_s"]["wheels"] = 0.1
        raise RuntimeError("the probe printed no JSON")

    monkeypatch.setattr(check, "check", broken)
    assert check.main() == 1
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["result"] == "error" and "the probe printed no JSON" in report["error"]
    assert report["stages_s"] == {"wheels": 0.1}
    assert "Traceback" in (tmp_path / "gpu_check.log").read_text()


def test_the_gpu_benchmark_cuts_its_rounds_to_its_time_budget(tmp_path):
    env = dict(os.environ, WORKBENCH_BENCH_RESULTS=str(tmp_path), OMP_NUM_THREADS="1")
    script = os.path.join(ROOT, "benchmarks", "gpu_bench.py")
    proc = subprocess.run(
        [sys.executable, script, "--quick", "--rounds", "40", "--budget-s", "1"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("gpu-quick-*.json")
    doc = json.loads(path.read_text())
    s = doc["summary"]["compile_off"]
    # start-up and warm-up alone take more than 1 s: one round, the least a figure needs
    assert s["rounds_run"] == len(doc["rounds"]) == 1 and s["rounds_cut_by_budget"] is True
    assert doc["args"]["budget_s"] == 1 and "deadline" not in doc["args"]


@pytest.mark.parametrize("bad", ["0", "-5"])
def test_a_budget_under_a_second_is_refused_before_anything_runs(bad, tmp_path):
    env = dict(os.environ, WORKBENCH_BENCH_RESULTS=str(tmp_path))
    script = os.path.join(ROOT, "benchmarks", "gpu_bench.py")
    proc = subprocess.run(
        [sys.executable, script, "--quick", "--budget-s", bad], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2 and "--budget-s must be at least 1" in proc.stderr
    assert not list(tmp_path.glob("*.json"))


def _hang_on_rank_1(rank, world, folder):
    with open(os.path.join(folder, f"pid{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if rank == 1:
        time.sleep(600)
    return rank


def test_a_rank_that_never_answers_is_cut_at_the_harness_timeout_and_ended(tmp_path):
    """The GPU tier's CPU ranks (``gloo_harness``): a hang costs its timeout once, whatever the
    other ranks took to start, and leaves no process (it would hold the check's next stage)."""
    import queue

    from gloo_harness import run_ranks

    # the fork server (torch imported once, ~10 s) started before the clock: what is timed is
    # the ranks' start, the timeout, and ending them (5 s for the one that never answers)
    (tmp_path / "warm").mkdir()
    assert run_ranks(_hang_on_rank_1, 1, args=(str(tmp_path / "warm"),), timeout=120) == [0]
    t = time.monotonic()
    with pytest.raises(queue.Empty):
        run_ranks(_hang_on_rank_1, 2, args=(str(tmp_path),), timeout=15)
    # the timeout holds for all ranks together: waiting it again (or per rank) takes 30 s
    assert time.monotonic() - t < 15 + 5 + 8
    for rank in (0, 1):
        pid = int((tmp_path / f"pid{rank}").read_text())
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, rank


_FAKE_BENCH = textwrap.dedent(
    """
    import json, os, sys, time
    mode, budget = sys.argv[sys.argv.index("--compile") + 1], float(sys.argv[sys.argv.index("--budget-s") + 1])
    out = os.environ["WORKBENCH_BENCH_RESULTS"]
    with open(os.path.join(out, "argv-" + mode), "w") as f:
        json.dump(budget, f)
    if mode == "on" and os.environ["FAKE_ON"] == "overrun":
        time.sleep(600)  # as a compile that overruns everything it was given
    if mode == "on" and os.environ["FAKE_ON"] == "crash":
        sys.exit("inductor failed")  # exit 1, as a missed target, but no figure
    summary = {"ratio": 0.99, "trainer_tps": 1.0, "plain_tps": 1.0}
    doc = {"summary": {"compile_" + mode: summary}, "machine": {"gpu": "NVIDIA H200"},
           "targets": [{"name": "trainer/plain", "value": 0.99, "op": ">=", "limit": 0.97, "met": True}]}
    with open(os.path.join(out, "gpu-" + mode + ".json"), "w") as f:
        json.dump(doc, f)
    """
)


def _fake_benchmark(tmp_path, on: str):
    """The benchmark stage as it runs where CUDA is, with a stand-in for gpu_bench.py (no GPU here)."""
    check = _check_module()
    fake = tmp_path / "fake_bench.py"
    fake.write_text(_FAKE_BENCH)
    check.BENCH, check.GRACE_S = str(fake), 2
    # the stage keeps 10 s of the budget back: compile on runs (and overruns) 15 s
    check.BUDGET_S, check.BENCH_NEEDS_S, check.KEPT_FOR_COMPILE_S = 25, {"off": 5, "on": 5}, 10
    out = tmp_path / "out"
    out.mkdir()
    with open(tmp_path / "log", "w") as log:
        found = check.benchmark(str(out), log, dict(os.environ, FAKE_ON=on), time.time(), cuda=True)
    return found, out


def test_on_a_gpu_the_benchmark_stage_keeps_a_figure_when_compile_on_overruns(tmp_path):
    """Each mode is told a budget inside the time it has, compile on is cut at its time, and
    the compile-off figure still decides the result."""
    found, out = _fake_benchmark(tmp_path, "overrun")
    assert found["result"] == "met" and found["failed"] == []
    assert list(found["runs"]) == ["compile_off"]
    assert found["runs"]["compile_off"]["summary"]["ratio"] == 0.99
    assert found["runs"]["compile_off"]["gpu"] == "NVIDIA H200"
    (skipped,) = found["skipped"]
    assert skipped.startswith("compile on: ran past the")
    # off was left its share and kept 10 s for on; each was told less than it had
    off, on = (json.loads((out / f"argv-{m}").read_text()) for m in ("off", "on"))
    assert off <= 25 - 10 - 10 - 2 and on <= 25 - 10 - 2
    assert "timed out after" in (tmp_path / "log").read_text()


def test_on_a_gpu_a_benchmark_mode_that_breaks_fails_the_stage(tmp_path):
    """A mode that exits without a figure is a failure, not a missed target nor a figure."""
    found, _ = _fake_benchmark(tmp_path, "crash")
    assert found["result"] == "failed"
    assert found["failed"] == ["compile on: exit 1 without a figure (gpu_check.log says why)"]
    assert list(found["runs"]) == ["compile_off"] and found["skipped"] == []
