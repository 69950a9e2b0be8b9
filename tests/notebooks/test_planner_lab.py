"""Execute notebooks/lab_07_plan_70b.ipynb headless and check the numbers it prints."""

from __future__ import annotations

from pathlib import Path

from notebook_runs import executed, outputs_text, saved_notebook_run

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "lab_07_plan_70b.ipynb"
TIMEOUT = 120  # seconds per cell


def test_lab_07_executes_and_prints_the_plan(request):
    nb = executed(saved_notebook_run(request))
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
        # the note on the two activation formulas, both numbers (Llama: no dropout, so
        # the stored scores are the softmax output alone, 2as/h)
        "llama3-70b: 2as/h = 128 against 33.5 -> eager 1,354.8 MB/layer, flash 281.0 MB/layer (4.8x)",
        "llama3-405b: 2as/h = 128 against 31.75 -> eager 2,680.2 MB/layer, flash 532.7 MB/layer (5.0x)",
    ):
        assert needle in text, needle
    # every workbench.labs.check on the answers between the solution markers passed
    from workbench.labs.student import check_names

    checks = [n for c in nb.cells if c.cell_type == "code" for n in check_names(c.source)]
    passed = [line for line in text.splitlines() if line.startswith("check passed: ")]
    assert len(checks) == len(passed) == 5, (checks, passed)
    assert "check passed: ZeRO-3 model states per GPU: 4.41 GB" in text
