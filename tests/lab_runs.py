"""The labs' runs for the session: each lab's instructor version and its student version.

A student version is the lab with every solution blanked; every cell before the first
solution cell is the instructor's, unchanged (test_labs_student checks that). Where a session
tests both versions of a lab, they share one kernel and one rank set: the instructor's cells
run up to the first solution cell, then the student's blank and the check after it (which
must fail, as a student's run stops there), then the instructor's cells from the first
solution on, to the end. The student's executed copy holds the shared cells' outputs and
those of its own cells up to the one that failed; the cells after it are not run, as in a
run of the student version alone. A lab whose one version alone is tested runs alone, as
do the labs in ``ALONE``.
"""

from __future__ import annotations

import copy
import os
import pathlib
import sys
import time

import nbformat
from notebook_runs import (
    ROOT,
    NotebookRun,
    RunPool,
    alive,
    end_lab_ranks,
    execute_notebook,
    lab_rank_pids,
    outputs_text,
    private_env,
    ranks_after,
)

NOTEBOOKS = ROOT / "notebooks"
INSTRUCTOR, STUDENT = "instructor", "student"

# student versions always run alone, so that a kernel's exit (not the lab's ``%distrain
# stop``) stopping the ranks of a run stopped at its blank stays checked
ALONE = {"lab_01_data_parallel.ipynb"}

# labs that make a network namespace (ip netns add): run as root, skipped (not run) otherwise
NEEDS_ROOT = {"lab_12_slow_link.ipynb"}

# a cell's time limit where a lab has a longer cell than the 180 s the others fit in: lab 14's
# 70B dry run is ~40 s of both cores' CPU, stretched by the lab running beside it
TIMEOUT = {"lab_14_dry_run.ipynb": 480}


def runnable(lab: str) -> str | None:
    """Why ``lab`` cannot run here, or None."""
    if lab in NEEDS_ROOT and os.geteuid() != 0:
        return f"{lab} makes a network namespace: it needs root"
    return None


def _first_solution(nb) -> int:
    from workbench.labs.student import SOLUTION_TAG, tags

    return next(i for i, c in enumerate(nb.cells) if SOLUTION_TAG in tags(c))


def _same_until_first_blank(instructor, student) -> bool:
    """Whether the cells before the first solution cell are the same in both versions (only
    then can one run of them stand for both; otherwise each version runs alone)."""
    first = _first_solution(instructor)
    cells = [(c.cell_type, c.source) for c in instructor.cells[:first]]
    return len(student.cells) == len(instructor.cells) and cells == [
        (c.cell_type, c.source) for c in student.cells[:first]
    ]


def _check_after(nb, index: int) -> int:
    from workbench.labs.student import TESTS_TAG, tags

    return next(i for i, c in enumerate(nb.cells) if i > index and TESTS_TAG in tags(c))


async def _execute_both(
    client, instructor, student, env: dict
) -> tuple[BaseException | None, BaseException | None, float]:
    """Run ``instructor`` in ``client``'s kernel with ``student``'s first blank and its check
    in between; returns (instructor's error, student's error, seconds to the student's stop)."""
    from jupyter_core.utils import ensure_async
    from nbclient.exceptions import CellExecutionError

    first = _first_solution(instructor)
    check = _check_after(student, first)
    t0 = time.perf_counter()
    student_error: BaseException | None = None
    student_seconds = 0.0
    count = 0
    async with client.async_setup_kernel(env=env):
        info = await client.async_wait_for_reply(await ensure_async(client.kc.kernel_info()))
        instructor.metadata["language_info"] = info["content"]["language_info"]
        for index, cell in enumerate(instructor.cells):
            if index == first:
                student_count = count
                client.nb = student
                for s_index in range(first, check + 1):
                    cell_s = student.cells[s_index]
                    student_count += cell_s.cell_type == "code"
                    try:
                        await client.async_execute_cell(cell_s, s_index, execution_count=student_count)
                    except CellExecutionError as exc:
                        student_error = exc
                        break
                else:
                    student_error = AssertionError(
                        f"the student version ran past its first blank's check (cell {check}) without an error"
                    )
                student_seconds = time.perf_counter() - t0
                client.nb = instructor
            count += cell.cell_type == "code"
            try:
                await client.async_execute_cell(cell, index, execution_count=count)
            except CellExecutionError as exc:
                if student_error is None:  # stopped before the blank: the student version stops there too
                    student_error, student_seconds = exc, time.perf_counter() - t0
                    for i in range(index + 1):
                        student.cells[i] = copy.deepcopy(instructor.cells[i])
                return exc, student_error, student_seconds
            if index < first:
                student.cells[index] = copy.deepcopy(cell)  # the same cell, run once for both
        client.set_widgets_metadata()
    return None, student_error, student_seconds


def execute_both(instructor, student, name: str, state: pathlib.Path, timeout: float = 180):
    """``(instructor run, student run)`` of lab ``name`` in one kernel (see the module's
    docstring), then as :func:`notebook_runs.execute_notebook`: the ranks printed get 15 s to go,
    any still there are ended by pid."""
    from jupyter_core.utils import run_sync
    from nbclient import NotebookClient

    env = private_env(state)
    student = copy.deepcopy(student)
    client = NotebookClient(
        instructor, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(ROOT)}}
    )
    client.reset_execution_trackers()
    t0 = time.perf_counter()
    try:
        error, student_error, student_seconds = run_sync(_execute_both)(client, instructor, student, env)
    except BaseException:
        # a cell that ran past the timeout was interrupted: its traceback says where it waited
        last = [c for c in instructor.cells if c.get("outputs")][-1:]
        for o in last[0].outputs if last else []:
            sys.stderr.write("".join(o.get("traceback", [])) or o.get("text", ""))
        end_lab_ranks(lab_rank_pids(outputs_text(instructor)))
        raise
    seconds = time.perf_counter() - t0
    pids, left = ranks_after(instructor)
    s_pids = lab_rank_pids(outputs_text(student))
    return (
        NotebookRun(name, instructor, error, seconds, pids, left, state, env),
        NotebookRun(name, student, student_error, student_seconds, s_pids, alive(s_pids), state, env),
    )


class LabRuns:
    """The session's lab runs, two at a time in the order the tests run, shared by the test
    modules that name ``LAB_VERSION`` (instructor or student) and ``LAB_PARAM`` (their
    parameter that names the lab)."""

    def __init__(self, session):
        from workbench.labs.build import build

        wanted: dict[str, set[str]] = {}
        for item in session.items:
            module = getattr(item, "module", None)
            version, param = getattr(module, "LAB_VERSION", None), getattr(module, "LAB_PARAM", None)
            spec = getattr(item, "callspec", None)
            if version and spec is not None and param in spec.params:
                wanted.setdefault(spec.params[param], set()).add(version)
        self.pool = RunPool("labs")
        self._keys: dict[tuple[str, str], tuple[str, int | None]] = {}
        built = {b.lab: b for b in build(NOTEBOOKS, self.pool.folder("built"))}
        for lab, versions in wanted.items():
            if runnable(lab):
                continue
            instructor = nbformat.read(NOTEBOOKS / lab, as_version=4)
            student = nbformat.read(built[lab].student, as_version=4)
            if versions == {INSTRUCTOR, STUDENT} and lab not in ALONE and _same_until_first_blank(instructor, student):
                self.pool.submit(
                    lab, execute_both, instructor, student, lab, self.pool.folder(lab), TIMEOUT.get(lab, 180)
                )
                self._keys[(INSTRUCTOR, lab)], self._keys[(STUDENT, lab)] = (lab, 0), (lab, 1)
                continue
            for version in sorted(versions):
                key = f"{version}-{lab}"
                nb = instructor if version == INSTRUCTOR else student
                self.pool.submit(key, execute_notebook, nb, lab, self.pool.folder(key), TIMEOUT.get(lab, 180))
                self._keys[(version, lab)] = (key, None)

    def result(self, version: str, lab: str) -> NotebookRun:
        key, part = self._keys[(version, lab)]
        run = self.pool.result(key)
        return run if part is None else run[part]


_labs: LabRuns | None = None


def lab_run(request, lab: str) -> NotebookRun:
    """The run of ``lab``'s version ``LAB_VERSION`` (of ``request``'s test module); the first
    call submits every lab run the session's tests need."""
    global _labs
    if _labs is None:
        _labs = LabRuns(request.session)
        request.config.add_cleanup(_labs.pool.close)
    return _labs.result(request.module.LAB_VERSION, lab)
