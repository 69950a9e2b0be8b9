"""No import cycles in the package (the shared tool the lead runs)."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOOL = ROOT / "tests" / "unit" / "import_cycles.py"  # a copy of the project's shared tool


def test_no_import_cycles():
    out = subprocess.run(
        [sys.executable, str(TOOL), "workbench"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    cycles = {line for line in out.stdout.splitlines() if line.startswith("cycle:")}
    assert not cycles, cycles
    assert "cycles=0" in out.stdout, out.stdout[-2000:]
