"""``make gpu-check``: the GPU tests on the machine it runs on, one JSON report and a log.

Installs the wheels of ``make gpu-wheels`` (the GPU machine has no network), runs ``pytest -m
gpu``, then ``benchmarks/gpu_features_bench.py`` and ``benchmarks/gpu_bench.py``, within one
budget (``BUDGET_S``), into ``gpu_check.json`` and ``gpu_check.log`` under ``$GPU_CHECK_OUT``
(else ``$OUT``); the report is rewritten after every stage, so a check cut short leaves what
it had (stages and budgets: docs/gpus.md). Stdlib only: torch is asked in a subprocess."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELS = os.path.join(ROOT, ".whl")
SITE = os.environ.get("GPU_CHECK_SITE", "/tmp/workbench-gpu-site")
CACHE = "/tmp/workbench-gpu-cache"  # torch.compile's caches (inductor, Triton)
BUDGET_S = float(os.environ.get("GPU_CHECK_BUDGET_S") or 8 * 60)
BENCH_RESERVE_S = 170  # kept from the tests for the benchmark: compile off, then on
TEST_TIMEOUT_S = 200  # one test, its module's spawned GPU run included (the longest: ~8 strategies)
GRACE_S = 20  # between SIGINT and SIGKILL: pytest writes its report, pools end their workers
# nothing may reach for a network there: fail at once rather than wait on a connection
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
BENCH = os.path.join(ROOT, "benchmarks", "gpu_bench.py")
FEATURES = os.path.join(ROOT, "benchmarks", "gpu_features_bench.py")
FEATURES_RESERVE_S = 110  # kept from the tests for the features benchmark (8 configurations, compile)
FEATURES_NEEDS_S = 40  # the least that gives a figure (start-up, the first configuration)
# the least each compile mode needs to give a figure (start-up, warm-up: with compile on,
# inductor compiling forward and backward, then two rounds), and what compile off leaves to on
BENCH_NEEDS_S = {"off": 45, "on": 100}
KEPT_FOR_COMPILE_S = 110


def out_dir() -> str:
    out = os.environ.get("GPU_CHECK_OUT") or os.environ.get("OUT")
    if not out:
        sys.exit("gpu-check: set GPU_CHECK_OUT (or OUT) to the folder for the report and log")
    os.makedirs(out, exist_ok=True)
    return out


def _signal_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _sigint_default() -> None:
    """In the stage, before its program starts: SIGINT interrupts it even where the check itself
    runs in the background (``nohup make gpu-check &``), whose shell starts it with SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(cmd: list[str], log, env, timeout: float) -> int:
    """``cmd`` in its own process group, output to ``log``; past ``timeout``: SIGINT, then
    SIGKILL after ``GRACE_S``, and 124. Whatever it left running in its group is killed after."""
    log.write(f"$ {' '.join(cmd)}  (at most {timeout:.0f} s)\n")
    log.flush()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_sigint_default
    )
    try:
        code = proc.wait(timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        log.write(f"\n[gpu-check] timed out after {timeout:.0f} s: SIGINT to its process group\n")
        log.flush()
        _signal_group(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            log.write(f"[gpu-check] still running {GRACE_S} s later: SIGKILL\n")
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        code = 124
    if _signal_group(proc.pid, signal.SIGKILL):  # a spawned worker outlived its parent
        log.write("[gpu-check] killed processes left behind in the stage's group\n")
    log.flush()
    return code


def probe(env, log) -> dict:
    """torch, CUDA, the GPU and NCCL as this Python sees them (a subprocess: this one stays stdlib)."""
    code = (
        "import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
        "'cuda': c, 'gpu': torch.cuda.get_device_name(0) if c else None, "
        "'gpus': torch.cuda.device_count() if c else 0, "
        "'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if c else None}))"
    )
    try:
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        log.write("[gpu-check] torch's probe ran past 120 s\n")
        return {"cuda": False, "probe": "timed out"}
    log.write(p.stdout + p.stderr)
    if p.returncode != 0:
        return {"cuda": False, "probe": f"failed (exit {p.returncode})"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    t0 = time.time()
    out = out_dir()
    env = dict(os.environ, PYTHONUNBUFFERED="1", **OFFLINE)
    for var, sub in (
        ("TRITON_CACHE_DIR", "triton"),
        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
    ):  # writable, whatever HOME is
        env.setdefault(var, os.path.join(CACHE, sub))
    report: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": sys.version.split()[0],
        "budget_s": BUDGET_S,
        "result": "running",
        "stages_s": {},
    }
    with open(os.path.join(out, "gpu_check.log"), "w") as log:
        try:
            return check(out, report, env, log, t0)
        except Exception:  # the report is written whatever broke
            log.write(traceback.format_exc())
            report["result"] = "error"
            report["error"] = traceback.format_exc().strip().splitlines()[-1]
            return finish(out, report, t0, 1)


def check(out: str, report: dict, env: dict, log, t0: float) -> int:
    def stage(name: str, since: float) -> None:
        report["stages_s"][name] = round(time.time() - since, 1)
        save(out, report, t0)

    t = time.time()
    wheels = sorted(glob.glob(os.path.join(WHEELS, "*.whl")))
    report["wheels"] = [os.path.basename(w) for w in wheels]
    if wheels and sys.version_info[:2] != (3, 12):
        report["wheels_installed"] = False
        log.write(f"the wheels are for CPython 3.12, this is {report['python']}: not installed\n")
        wheels = []
    if wheels:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
        rc = run([*pip, "--no-cache-dir", "--upgrade", "--target", SITE, *wheels], log, env, 180)
        report["wheels_installed"] = rc == 0
        if rc != 0:
            report["result"] = "wheel install failed"
            return finish(out, report, t0, 1)
        env["PYTHONPATH"] = os.pathsep.join([SITE, ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    else:
        env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    stage("wheels", t)

    t = time.time()
    report.update(probe(env, log))
    if not report["cuda"]:
        report["note"] = "no CUDA: the GPU tests skip here; nothing about the CUDA path was checked"
    stage("probe", t)

    t = time.time()
    junit = os.path.join(out, "gpu_tests.xml")
    pytest = [sys.executable, "-m", "pytest", "-q", "-ra", "-m", "gpu", f"--timeout={TEST_TIMEOUT_S}"]
    left = BUDGET_S - (time.time() - t0) - BENCH_RESERVE_S - FEATURES_RESERVE_S
    rc = run(
        [
            *pytest,
            "-p",
            "no:cacheprovider",
            f"--junitxml={junit}",
            *os.environ.get("GPU_CHECK_TESTS", "tests/gpu").split(),
        ],
        log,
        env,
        max(60, left),
    )
    report["tests"] = junit_counts(junit)
    report["pytest_exit"] = rc
    ok = rc == 0 or (rc == 5 and not report["cuda"])  # 5: every test deselected/skipped
    stage("tests", t)

    t = time.time()
    report["features"] = features(out, log, env, t0, report["cuda"])
    ok = ok and report["features"]["result"] in ("measured", "skipped", "no CUDA")
    stage("features", t)

    t = time.time()
    report["benchmark"] = benchmark(out, log, env, t0, report["cuda"])
    bench_ok = report["benchmark"]["result"] in ("met", "no CUDA")
    stage("benchmark", t)
    report["result"] = ("pass" if report["cuda"] else "no CUDA") if ok and bench_ok else "fail"
    return finish(out, report, t0, 0 if ok and bench_ok else 1)


def features(out: str, log, env, t0: float, cuda: bool) -> dict:
    """``gpu_features_bench.py`` in the time the tests left it, before the trainer benchmark's share."""
    env = dict(env, WORKBENCH_BENCH_RESULTS=out)
    if not cuda:
        rc = run([sys.executable, FEATURES], log, env, 120)
        return {"result": "no CUDA" if rc == 0 else f"failed (exit {rc})", "note": "nothing measured without CUDA"}
    left = BUDGET_S - (time.time() - t0) - BENCH_RESERVE_S
    if left < FEATURES_NEEDS_S:
        return {
            "result": "skipped",
            "note": f"{left:.0f} s left before the benchmark's share, {FEATURES_NEEDS_S} s needed",
        }
    before = set(glob.glob(os.path.join(out, "gpu-features-*.json")))
    code = run([sys.executable, FEATURES, "--budget-s", f"{max(1, left - 20):.0f}"], log, env, left)
    new = sorted(set(glob.glob(os.path.join(out, "gpu-features-*.json"))) - before)
    if not new:
        return {"result": "skipped" if code == 124 else "failed", "exit": code, "note": "no figure (gpu_check.log)"}
    with open(new[-1]) as f:
        summary = json.load(f)["summary"]
    return {
        "result": "measured" if code == 0 and not summary["failed"] else "failed",
        "file": os.path.basename(new[-1]),
        **{k: summary[k] for k in ("step_ms", "speedup", "skipped", "failed")},
    }


def benchmark(out: str, log, env, t0: float, cuda: bool) -> dict:
    """``gpu_bench.py`` compile off, then compile on if the budget allows; its JSON into ``out``."""
    env = dict(env, WORKBENCH_BENCH_RESULTS=out)
    if not cuda:
        rc = run([sys.executable, BENCH], log, env, 120)
        return {"result": "no CUDA" if rc == 0 else f"failed (exit {rc})", "note": "nothing measured without CUDA"}
    found: dict = {"runs": {}, "skipped": [], "failed": []}
    for mode in ("off", "on"):
        needs = BENCH_NEEDS_S[mode]
        left = BUDGET_S - (time.time() - t0) - 10
        if left < needs:
            found["skipped"].append(f"compile {mode}: {left:.0f} s left of the budget, {needs} s needed")
            continue
        if mode == "off":  # leave the compiled run its share
            left = min(left, max(needs, left - KEPT_FOR_COMPILE_S))
        before = set(glob.glob(os.path.join(out, "gpu-*.json")))
        cmd = [sys.executable, BENCH, "--compile", mode, "--budget-s", f"{max(1, left - 10):.0f}"]
        code = run(cmd, log, env, left)
        new = sorted(set(glob.glob(os.path.join(out, "gpu-*.json"))) - before)
        if code == 124:  # not a figure: said as such, the other mode still counts
            found["skipped"].append(f"compile {mode}: ran past the {left:.0f} s it had")
        elif not new:  # it broke (a missed target still writes its figures, and exits 1)
            found["failed"].append(f"compile {mode}: exit {code} without a figure (gpu_check.log says why)")
        if new:
            with open(new[-1]) as f:
                doc = json.load(f)
            found["runs"][f"compile_{mode}"] = {
                "file": os.path.basename(new[-1]),
                "exit": code,
                "summary": doc["summary"].get(f"compile_{mode}"),
                "targets": doc["targets"],
                "gpu": doc["machine"].get("gpu"),
            }
    targets = [t for r in found["runs"].values() for t in r["targets"]]
    if found["failed"] or not found["runs"]:
        found["result"] = "failed"
    else:
        found["result"] = "met" if all(t["met"] for t in targets) else "missed"
    return found


def junit_counts(path: str) -> dict:
    import xml.etree.ElementTree as ET

    if not os.path.exists(path):
        return {}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:  # cut off while being written
        return {"unreadable": str(exc)}
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


def save(out: str, report: dict, t0: float) -> None:
    report["wall_s"] = round(time.time() - t0, 1)
    tmp = os.path.join(out, "gpu_check.json.tmp")
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2)
    os.replace(tmp, os.path.join(out, "gpu_check.json"))


def finish(out: str, report: dict, t0: float, code: int) -> int:
    save(out, report, t0)
    print(json.dumps(report, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
