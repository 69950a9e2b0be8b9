"""Execute notebooks/lab_07_plan_70b.ipynb headless and check the numbers it prints."""

from __future__ import annotations

import os
from pathlib import Path

from notebook_runs import execute_saved_notebook, outputs_text

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "notebooks" / "lab_07_plan_70b.ipynb"


def test_lab_07_executes_and_prints_the_plan(jupyter_dirs):
    nb = execute_saved_notebook(LAB, timeout=120)
    text = outputs_text(nb)
    for needle in (
        "parameters: 70.55B",
        "model states: 1128.9 GB",
        "153,600 GPU-hours",
        "0.461M USD",
        "24,192 GPU-hours",
        "0.145M USD",
        "MFU 45% of the dense fp8 peak",
        "bubble: 10.9%",
        "TP within a node",
        # the note on the two activation formulas, both numbers
        "llama3-70b: 5as/h = 320 against 34 -> eager 2,969.6 MB/layer, flash 285.2 MB/layer (10.4x)",
        "llama3-405b: 5as/h = 320 against 34 -> eager 5,939.1 MB/layer, flash 570.4 MB/layer (10.4x)",
    ):
        assert needle in text, needle
    # every workbench.labs.check on the answers between the solution markers passed
    from workbench.labs.student import check_names

    checks = [n for c in nb.cells if c.cell_type == "code" for n in check_names(c.source)]
    passed = [line for line in text.splitlines() if line.startswith("check passed: ")]
    assert len(checks) == len(passed) == 5, (checks, passed)
    assert "check passed: ZeRO-3 model states per GPU: 4.41 GB" in text
    assert os.environ["IPYTHONDIR"].startswith(str(jupyter_dirs))
