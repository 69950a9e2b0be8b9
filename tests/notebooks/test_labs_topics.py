"""Execute labs 08-11 (collectives, sequence/context parallelism, a 3D layout, failures)
headless, instructor version: every check passes on numbers measured in the run itself,
the key results of each lesson are printed, and no rank process is left behind.

Labs 08, 09 and 11 start two gloo ranks; lab 10 needs four (pipeline x FSDP2 and
pipeline x TP; the 8-rank pp x dp_shard x tp layout is validated in it, not run). Their
student versions are run to the first blank by test_labs_student.
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

# lab -> (ranks, strings its outputs must contain)
LABS = {
    "lab_08_collectives_bandwidth.ipynb": (
        2,
        [
            "all_reduce busbw",
            "= algbw x 1 on 2 ranks",
            "the ring all-reduce equals dist.all_reduce on all 2 ranks",
            "a ring all-reduce of 4,096 bytes sends 2(n-1)/n x B = 4,096 bytes per rank on 2 ranks",
            "all-reduce on 2 ranks: alpha = ",
        ],
    ),
    "lab_09_sequence_context_parallel.ipynb": (
        2,
        [
            "eager attention saves 4·b·heads·(3·s·d + s²) bytes",
            "SP's pair sends 262,144 bytes per rank, the same as TP's all-reduce",
            "ring attention equals full attention on every rank",
        ],
    ),
    "lab_10_3d_layout.ipynb": (
        4,
        [
            "8 ranks: pp dp_shard=2 tp=2 pp=2 | mesh pp=2 x dp_shard=2 x tp=2",
            "both layouts' first loss equals the single-rank loss",
            "rank 0's dp_shard group is [0, 1]",
            "measured parameter, gradient and optimizer bytes equal the planner's on every rank",
            "rank 0 holds 34,944 parameter bytes",
        ],
    ),
    "lab_11_failures.ipynb": (
        2,
        [
            "never reached the collective that rank(s)",
            "wait in all_reduce",
            "your per-rank test finds exactly the non-finite gradients on every rank",
            "the non-finite gradients started on rank",
            "is the newest checkpoint that verifies and precedes the NaN (step 7)",
            "rolled back to step 4",
        ],
    ),
}


def expected_passes(nb) -> int:
    """One pass line per ``workbench.labs.check(`` call and per plain "check passed" print."""
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    return sum(
        s.count("workbench.labs.check(") + s.count('print(f"check passed') + s.count('print("check passed')
        for s in code
    )


@pytest.mark.parametrize("name", sorted(LABS))
def test_new_lab_executes_and_its_checks_pass(name, request):
    ranks, needles = LABS[name]
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    solutions = [c for c in nb.cells if "solution" in c.metadata.get("tags", [])]
    assert len(solutions) >= 2 and all("### BEGIN SOLUTION" in c.source for c in solutions)
    check_lab_source(nb, ranks)
    check_lab_run(lab_run(request, name), ranks, expected_passes(nb), needles)
