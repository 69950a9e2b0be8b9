"""Every script in examples/ runs to the end and prints what it promises."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# script -> (arguments, lines its output must contain)
EXPECTED = {
    "api_without_magics.py": (
        [],
        [
            "2 ranks up in",
            "[rank 1] hello from rank 1",
            "all_reduce through apply: every rank has 1.5",
            "pulled steps: [3, 6]",
            "[rank 0] only here",
            "ranks stopped",
        ],
    ),
    "ddp_two_ranks.py": ([], ["strategy path:", "both ranks hold identical weights; the loss went down"]),
    "plan_a_layout.py": ([], ["Llama 70b on 256 x h100", "memory per GPU", "MFU:"]),
}


def test_every_example_is_tested():
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs(script):
    args, expected = EXPECTED[script]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=200
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for line in expected:
        assert line in proc.stdout, f"{line!r} missing from the output of {script}:\n{proc.stdout}"
