"""Execute lab 14 (a dry run at full scale) headless, instructor version: Llama 3 70B dry-run
on 512 fake ranks (4 positions, 4 processes) beside the planner, then a small Llama dry-run
against the same layout on 8 live gloo ranks; every check passes on values measured in the
run and none of the 8 rank processes is left behind. Its student version runs to its first
blank in test_labs_student (in the same kernel, see lab_runs).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from lab_runs import lab_run
from notebook_runs import check_lab_run, check_lab_source
from test_labs_topics import expected_passes

ROOT = Path(__file__).resolve().parents[2]
LAB = "lab_14_dry_run.ipynb"
LAB_VERSION, LAB_PARAM = "instructor", "name"  # the runs: lab_runs.lab_run

NEEDLES = [
    "512 ranks, 4 positions (one per stage, each for its 128 ranks over dp_shard x tp), 4 processes",
    "a middle stage's rank holds 534,855,680 bytes of parameters, twice the paper's 267,427,840",
    "parameters, gradients and optimizer state equal the planner's on every stage",
    "implementation: it moves stage 0's peak by",
    "on all 8 ranks the dry run's parameter, gradient and optimizer bytes equal the live ranks'",
    "rank 5 holds",
]


@pytest.mark.parametrize("name", [LAB])
def test_lab_14_dry_runs_70b_and_a_small_model_against_live_ranks(name, request):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    check_lab_source(nb, 8)
    check_lab_run(lab_run(request, name), 8, expected_passes(nb), NEEDLES)
