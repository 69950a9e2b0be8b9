"""Execute the teaching labs (notebooks/lab_0[1-6]_*.ipynb) headless and check what they print.

Each lab starts its own two gloo ranks (``%distrain start -n 2 --backend gloo --threads 1``),
prints ``rank pids: [...]`` from ``%distrain status``, ends in ``%distrain stop``, and has
"check yourself" cells whose asserts print a ``check passed: ...`` line in the notebook
kernel (never on a rank, so the line does not depend on rank output reaching the notebook):
either directly or through ``workbench.labs.check`` on an answer written between nbgrader's
solution markers (cells tagged ``solution``; the checks in cells tagged ``tests``).
The test runs every lab with nbclient (two at a time, each in its own kernel, which the lab's
student version shares where the session tests it too: see lab_runs), checks that every
check cell passed, a few key numbers, and that none of the rank processes is alive afterwards.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from lab_runs import lab_run
from notebook_runs import check_lab_run, check_lab_source

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
LAB_VERSION, LAB_PARAM = "instructor", "name"  # the runs: lab_runs.lab_run

# lab file -> strings its outputs must contain (key numbers of the lesson)
LABS = {
    "lab_01_data_parallel.ipynb": [
        "21 per-parameter all-reduces vs 2 DDP buckets, 139,904 bytes each way",
        "check passed: DDP step == single-rank step",
        "check passed: each rank sends 139,904 bytes per step",
        "check passed: each of the 2 ranks takes 4 of the 8 examples",
    ],
    "lab_02_zero_fsdp_memory.ipynb": [
        "per-rank bytes DDP 559,616 -> ZeRO-1 349,760 -> ZeRO-3 279,808 = FSDP2 279,808; planner agrees",
        "check passed: DDP holds 16 bytes x 34,976 parameters = 559,616 bytes on every rank",
        "check passed: FSDP2 holds 16 x 34,976 / 2 = 279,808 bytes per rank, as measured",
    ],
    "lab_03_tensor_parallel.ipynb": [
        "hand-written TP forward and weight and input gradients equal the unsharded MLP",
        "each rank holds 50% of the parameter bytes",
        "check passed: W1_local is (32, 16) on each of the 2 ranks",
        "check passed: w2 is Shard(1): row-parallel splits the input features",
        "check passed: w2 is (32, 32) on each of the 2 ranks (global (32, 64))",
    ],
    "lab_04_pipeline_bubbles.ipynb": [
        "measured bubble 0.50 at m=1",
        "GPipe and 1F1B losses and gradients match",
        "first step equals the single-rank loss",
        "check passed: 48 rows x 320 x 4 bytes = 61,440 bytes per micro-batch",
        "check passed: the bubble is 0.111 of a GPipe step at p = 2, m = 8",
    ],
    "lab_05_precision_and_recompute.ipynb": [
        "recompute leaves the loss unchanged",
        "check passed: full recomputation keeps 0.0625 of none's activation bytes (2sbh / 32sbh)",
    ],
    "lab_06_moe_expert_parallel.ipynb": [
        "check passed: capacity 160 = ceil(1.25 x 256 x 2 / 4)",
        "aux loss = 0.01 x",
        "naive and all-to-all EP outputs equal the single-rank MoE",
    ],
}


def check_cells(nb) -> int:
    """Pass lines the lab prints: one per cell printing its own, one per ``workbench.labs.check`` call."""
    from workbench.labs.student import check_names

    return sum(
        (1 if "check passed" in c.source else 0) + len(check_names(c.source)) for c in nb.cells if c.cell_type == "code"
    )


@pytest.mark.parametrize("name", sorted(LABS))
def test_lab_executes_and_its_checks_pass(name, request):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    expected_checks = check_cells(nb)
    assert expected_checks >= 1, "each lab has check-yourself cells"
    check_lab_source(nb, 2)
    check_lab_run(lab_run(request, name), 2, expected_checks, LABS[name])
