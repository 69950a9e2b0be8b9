"""Every script in examples/ runs to the end and prints what it promises."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from notebook_runs import RunPool, private_env, selected

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


def run_example(script: str, folder: pathlib.Path) -> subprocess.CompletedProcess:
    """``python examples/SCRIPT`` from the repository root, its Jupyter/IPython state in ``folder``."""
    args, _ = EXPECTED[script]
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=ROOT,
        env=private_env(folder),
        capture_output=True,
        text=True,
        timeout=200,
    )


@pytest.fixture(scope="module")
def runs(request):
    """The examples this session tests, run two at a time from the module's first test."""
    with RunPool("examples") as pool:
        for script in selected(request, "test_example_runs", "script"):
            pool.submit(script, run_example, script, pool.folder(script))
        yield pool


@pytest.mark.timeout(440)  # its own run (at most 200 s) and the one it may wait behind
@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs(script, runs):
    _, expected = EXPECTED[script]
    proc = runs.result(script)
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    for line in expected:
        assert line in proc.stdout, f"{line!r} missing from the output of {script}:\n{proc.stdout}"
