"""Execute lab 13 (one sharding, two frameworks) headless, instructor version: two torch ranks
and two JAX ranks side by side, every check passes on values measured in the run (loss parity
within the stated tolerance, the same layout blocks, bytes per rank, the collectives each
framework inserts), and none of the four rank processes is left behind. Its student version
runs to its first blank in test_labs_student (in the same kernel, see lab_runs).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from lab_runs import lab_run
from notebook_runs import check_lab_run, check_lab_source
from test_labs_topics import expected_passes

pytest.importorskip("jax")

ROOT = Path(__file__).resolve().parents[2]
LAB = "lab_13_one_sharding_two_frameworks.ipynb"
LAB_VERSION, LAB_PARAM = "instructor", "name"  # the runs: lab_runs.lab_run

NEEDLES = [
    "'jax_ranks': 2 ranks up (jax, gloo, local launcher)",
    "JAX ranks imported torch: False",
    "torch and JAX agree within 1e-05 relative on the loss and on the loss after one SGD step",
    "DTensor's and NamedSharding's layouts hold the same blocks on the same ranks, both ways",
    "each rank holds 4,096 of the block's 8,192 bytes (1/2) on torch and on JAX",
    "FSDP-style gathers each of the 6 weights once in both frameworks",
    "all-reduce: DTensor issues it",
]


@pytest.mark.parametrize("name", [LAB])
def test_lab_13_runs_both_frameworks_and_its_checks_pass(name, request):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    check_lab_source(nb, 2)  # the torch set; the JAX set beside it is started with --framework jax
    assert any("%distrain start -n 2 --framework jax" in c.source for c in nb.cells if c.cell_type == "code")
    # 4 rank pids printed (2 torch + 2 JAX), all gone after the lab's stops
    check_lab_run(lab_run(request, name), 4, expected_passes(nb), NEEDLES)
