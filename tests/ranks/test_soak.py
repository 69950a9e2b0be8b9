"""Hours without growth, in short: ``benchmarks/soak_bench.py --short`` (300 steps on 2 ranks,
auto-save, telemetry and a live dashboard on, the store's window small enough to spill to its
Parquet history) stays inside the bounds docs/unattended.md states, and ``metrics()`` still
holds every step. Its own process: the notebook side's RSS, fds and threads are its alone."""

import json
import subprocess
import sys

from conftest import ROOT, alive
from notebook_runs import private_env


def test_a_short_soak_run_stays_flat_and_keeps_every_step(tmp_path):
    env = dict(private_env(tmp_path), WORKBENCH_BENCH_RESULTS=str(tmp_path / "results"), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak_bench.py"), "--short"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (saved,) = (tmp_path / "results").glob("soak-*.json")
    doc = json.loads(saved.read_text())
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert [s["step"] for s in doc["rounds"]] == list(range(50, 301, 50))
    assert all(t["met"] for t in doc["targets"]), [t for t in doc["targets"] if not t["met"]]
    end = doc["summary"]["end"]
    assert end["steps_in_metrics"] == {"0": True, "1": True} and end["loss_rows"] == 600
    assert end["spilled_rows"] > 0 and end["history_bytes"] > 0  # the window was passed: read back from disk
    assert max(s["store"]["rows"] for s in doc["rounds"]) <= 202
    assert alive(end["started_pids"]) == []  # the script's ranks ended with it
