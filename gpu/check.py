"""``make gpu-check``: the GPU tests on the machine it runs on, one JSON report and a log.

Installs the wheels of ``make gpu-wheels`` (``.whl/``) into a target folder put first on
PYTHONPATH (the GPU machine has no network), runs ``pytest -m gpu`` and writes
``gpu_check.json`` and ``gpu_check.log`` into ``$GPU_CHECK_OUT`` (else ``$OUT``). Without CUDA
the GPU tests skip and the report says ``"cuda": false`` ("no CUDA"); the exit status is
pytest's (a failed GPU test fails the check). ``GPU_CHECK_TESTS`` narrows the pytest
paths (default ``tests/gpu``, the GPU tier). Stdlib only: torch is asked in a subprocess.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEELS = os.path.join(ROOT, ".whl")
SITE = os.environ.get("GPU_CHECK_SITE", "/tmp/workbench-gpu-site")
BUDGET_S = 8 * 60


def out_dir() -> str:
    out = os.environ.get("GPU_CHECK_OUT") or os.environ.get("OUT")
    if not out:
        sys.exit("gpu-check: set GPU_CHECK_OUT (or OUT) to the folder for the report and log")
    os.makedirs(out, exist_ok=True)
    return out


def run(cmd: list[str], log, env, timeout: float) -> int:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        log.write(f"timed out after {timeout:.0f} s\n")
        return 124


def main() -> int:
    t0 = time.time()
    out = out_dir()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    report: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": sys.version.split()[0]}
    with open(os.path.join(out, "gpu_check.log"), "w") as log:
        wheels = sorted(glob.glob(os.path.join(WHEELS, "*.whl")))
        report["wheels"] = [os.path.basename(w) for w in wheels]
        if wheels and sys.version_info[:2] != (3, 12):
            report["wheels_installed"] = False
            log.write(f"the wheels are for CPython 3.12, this is {report['python']}: not installed\n")
            wheels = []
        if wheels:
            rc = run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-index",
                    "--no-deps",
                    "--no-compile",
                    "--no-cache-dir",
                    "--upgrade",
                    "--target",
                    SITE,
                    *wheels,
                ],
                log,
                env,
                180,
            )
            report["wheels_installed"] = rc == 0
            if rc != 0:
                report["result"] = "wheel install failed"
                return finish(out, report, t0, 1)
            env["PYTHONPATH"] = os.pathsep.join([SITE, ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        else:
            env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        probe = subprocess.run(
            [
                sys.executable,
                "-c",
                (
                    "import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
                    "'cuda': c, 'gpu': torch.cuda.get_device_name(0) if c else None, "
                    "'gpus': torch.cuda.device_count() if c else 0, "
                    "'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if c else None}))"
                ),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        log.write(probe.stdout + probe.stderr)
        report.update(json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 else {"cuda": False})
        if not report["cuda"]:
            report["note"] = "no CUDA: the GPU tests skip here; nothing about the CUDA path was checked"
        junit = os.path.join(out, "gpu_tests.xml")
        rc = run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-ra",
                "-m",
                "gpu",
                "-p",
                "no:cacheprovider",
                f"--junitxml={junit}",
                *os.environ.get("GPU_CHECK_TESTS", "tests/gpu").split(),
            ],
            log,
            env,
            max(60, BUDGET_S - (time.time() - t0) - 30),
        )
        report["tests"] = junit_counts(junit)
        report["pytest_exit"] = rc
        report["benchmark"] = "not built: benchmarks/gpu_bench.py does not exist yet"
        ok = rc == 0 or (rc == 5 and not report["cuda"])  # 5: every test deselected/skipped
        report["result"] = ("pass" if report["cuda"] else "no CUDA") if ok else "fail"
        return finish(out, report, t0, 0 if ok else 1)


def junit_counts(path: str) -> dict:
    import xml.etree.ElementTree as ET

    if not os.path.exists(path):
        return {}
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


def finish(out: str, report: dict, t0: float, code: int) -> int:
    report["wall_s"] = round(time.time() - t0, 1)
    with open(os.path.join(out, "gpu_check.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps(report, indent=2))
    return code


if __name__ == "__main__":
    sys.exit(main())
