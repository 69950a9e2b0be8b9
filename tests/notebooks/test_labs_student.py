"""The student versions ``make labs`` writes: deterministic, a blank for every solution,
and each one, executed on 2 gloo ranks, stops at its first blank with that check's hint.

The instructor versions (the notebooks themselves) run in test_labs, test_labs_topics and
test_planner_lab; where a session runs both versions of a lab they share one kernel (lab_runs).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from lab_runs import lab_run, runnable
from nbclient.exceptions import CellExecutionError

import workbench.labs as labs
from workbench.labs.build import build
from workbench.labs.checking import lookup
from workbench.labs.student import (
    ANSWER_HERE,
    BEGIN,
    CODE_HERE,
    END,
    SOLUTION_TAG,
    TESTS_TAG,
    LabFormatError,
    check_names,
    student_version,
    tags,
)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
LABS = sorted(p.name for p in NOTEBOOKS.glob("lab_*.ipynb"))
LAB_VERSION, LAB_PARAM = "student", "lab"  # the runs: lab_runs.lab_run

# lab -> the check its student version stops at (the first blank's)
FIRST_CHECK = {
    "lab_01_data_parallel.ipynb": "lab_01.local_batch",
    "lab_02_zero_fsdp_memory.ipynb": "lab_02.ddp_bytes_per_rank",
    "lab_03_tensor_parallel.ipynb": "lab_03.w1_local_shape",
    "lab_04_pipeline_bubbles.ipynb": "lab_04.send_bytes",
    "lab_05_precision_and_recompute.ipynb": "lab_05.full_over_none",
    "lab_06_moe_expert_parallel.ipynb": "lab_06.capacity",
    "lab_07_plan_70b.ipynb": "lab_07.ddp_gb",
    "lab_08_collectives_bandwidth.ipynb": "lab_08.busbw",
    "lab_09_sequence_context_parallel.ipynb": "lab_09.attention_bytes",
    "lab_10_3d_layout.ipynb": "lab_10.group",
    "lab_11_failures.ipynb": "lab_11.culprit",
    "lab_12_slow_link.ipynb": "lab_12.ddp_link_bytes",
    "lab_13_one_sharding_two_frameworks.ipynb": "lab_13.fsdp_bytes",
    "lab_14_dry_run.ipynb": "lab_14.stage_param_bytes",
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("labs")
    return out, build(NOTEBOOKS, out)


def test_every_lab_is_built(built):
    _, labs = built
    assert [b.lab for b in labs] == LABS and set(FIRST_CHECK) == set(LABS)
    assert all(b.blanks >= 1 for b in labs), [(b.lab, b.blanks) for b in labs]


def test_build_is_deterministic(built, tmp_path):
    out, first = built
    again = build(NOTEBOOKS, tmp_path)
    for a, b in zip(first, again):
        assert a.student.read_bytes() == b.student.read_bytes(), a.lab
        assert a.instructor.read_bytes() == b.instructor.read_bytes(), a.lab
    mtimes = [b.student.stat().st_mtime_ns for b in again]
    build(NOTEBOOKS, tmp_path)  # rebuilding the same sources rewrites nothing
    assert [b.student.stat().st_mtime_ns for b in again] == mtimes


@pytest.mark.parametrize("lab", LABS)
def test_every_solution_has_a_blank_and_every_check_stays(built, lab):
    out, _ = built
    src = nbformat.read(NOTEBOOKS / lab, as_version=4)
    student = nbformat.read(out / "student" / lab, as_version=4)
    assert len(src.cells) == len(student.cells)
    solutions = 0
    for i, (a, b) in enumerate(zip(src.cells, student.cells)):
        assert not b.get("outputs") and b.get("execution_count") is None
        if SOLUTION_TAG in tags(a):
            solutions += 1
            regions = a.source.count(BEGIN)
            assert regions == a.source.count(END) >= 1, (lab, i)
            assert BEGIN not in b.source and END not in b.source, (lab, i)
            assert b.source.count(ANSWER_HERE) + b.source.count(CODE_HERE) >= regions, (lab, i)
            ast.parse(re.sub(r"^%%distrain[^\n]*\n", "", b.source))  # the blank is valid Python (a rank cell's too)
            for line in b.source.splitlines():
                if ANSWER_HERE in line:
                    assert re.fullmatch(r"\s*\w+ = \.\.\.  # YOUR ANSWER HERE", line), line
        else:
            assert a.source == b.source, (lab, i)  # checks and everything else stay as they are
        if check_names(a.source):
            assert TESTS_TAG in tags(a), f"{lab} cell {i} calls workbench.labs.check: tag it {TESTS_TAG!r}"
            for name in check_names(a.source):
                assert name in labs.registered(name.split(".")[0]), name
    assert solutions >= 1
    # each solution cell is followed by a tests cell before the next solution
    kinds = [("s" if SOLUTION_TAG in tags(c) else "t") for c in src.cells if {SOLUTION_TAG, TESTS_TAG} & set(tags(c))]
    assert "ss" not in "".join(kinds) and kinds[-1] == "t", kinds


def test_markers_outside_a_solution_cell_are_refused():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"{BEGIN}\nx = 1\n{END}")])
    with pytest.raises(LabFormatError, match="not tagged 'solution'"):
        student_version(nb, "x.ipynb")
    cell = nbformat.v4.new_code_cell(f"{BEGIN}\nx = 1\n")
    cell.metadata["tags"] = [SOLUTION_TAG]
    with pytest.raises(LabFormatError, match="has no ### END SOLUTION"):
        student_version(nbformat.v4.new_notebook(cells=[cell]), "x.ipynb")


def test_code_regions_become_not_implemented():
    cell = nbformat.v4.new_code_cell(f"def f(x):\n    {BEGIN}\n    # square x\n    return x * x\n    {END}\n")
    cell.metadata["tags"] = [SOLUTION_TAG]
    nb, blanks = student_version(nbformat.v4.new_notebook(cells=[cell]), "x.ipynb")
    assert nb.cells[0].source == (
        "def f(x):\n    # YOUR CODE HERE\n    raise NotImplementedError('exercise: square x')\n"
    )
    assert [(b.kind, b.exercise) for b in blanks] == [("code", "square x")]


@pytest.mark.parametrize(
    "lab", [pytest.param(lab, marks=pytest.mark.skipif(bool(runnable(lab)), reason=str(runnable(lab)))) for lab in LABS]
)
def test_student_version_stops_at_its_first_blank_with_the_hint(request, lab):
    run = lab_run(request, lab)
    nb = run.nb
    assert isinstance(run.error, CellExecutionError), f"{lab}: the student version ran to the end: {run.error!r}"
    failed = [
        c for c in nb.cells if c.cell_type == "code" and any(o.output_type == "error" for o in c.get("outputs", []))
    ]
    assert len(failed) == 1
    error = next(o for o in failed[0].outputs if o.output_type == "error")
    name = FIRST_CHECK[lab]
    assert TESTS_TAG in tags(failed[0]) and check_names(failed[0].source)[0] == name, failed[0].source
    assert error.ename == "CheckFailed", (error.ename, error.evalue)
    assert error.evalue.startswith(f"{name}: no answer yet: replace the `...` ("), error.evalue
    question = lookup(name).__doc__.strip().splitlines()[0]
    assert question in error.evalue and name in str(run.error)
    # every cell before the blank ran and no check before it failed
    first = nb.cells.index(failed[0])
    assert all(c.execution_count is not None for c in nb.cells[:first] if c.cell_type == "code")
    if "%distrain start" in "".join(c.source for c in nb.cells):
        # every rank set the lab starts (lab 13 starts two of 2 ranks)
        starts = re.findall(r"%distrain start -n (\d+)", "".join(c.source for c in nb.cells if c.cell_type == "code"))
        assert len(run.pids) == sum(map(int, starts))
        # no rank is left: run alone (lab_runs.ALONE), the kernel's exit stops them; run in the
        # instructor version's kernel, its ``%distrain stop`` (each gets 15 s, see lab_runs)
        assert run.left == [], f"{lab}: the student run left rank processes behind: {run.left}"
    print(f"{lab} (student, to the first blank): {run.seconds:.1f} s")
