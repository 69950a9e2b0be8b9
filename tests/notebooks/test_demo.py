"""``make demo``: ``python -m workbench.notebook.demo NOTEBOOK --out DIR`` runs a notebook headless."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from notebook_runs import ROOT, quickstart, run_demo

from workbench.notebook import demo

pytestmark = pytest.mark.timeout(420)


def test_quickstart_demo_runs_and_summarises():
    run = quickstart()
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr[-3000:]}"
    assert run.run_dir.parent == ROOT / ".state" / "test" / "runs"
    assert run.executed.name == "00_quickstart.ipynb"
    nb = run.notebook()
    n_code = sum(c.cell_type == "code" for c in nb.cells)
    assert f"cells run     {n_code}/{n_code} code cells in " in run.stdout
    assert "ranks started 2" in run.stdout
    assert run.stdout.rstrip().endswith("OK")
    assert any(c.outputs for c in nb.cells if c.cell_type == "code")


def test_failing_cells_are_listed_and_exports_copied(tmp_path):
    folder = tmp_path / "nb"
    folder.mkdir()
    nb = new_notebook(
        cells=[
            new_markdown_cell("a notebook that fails on purpose"),
            new_code_cell("import os, pathlib\npathlib.Path('board.html').write_text('<html>beside</html>')"),
            new_code_cell(
                "pathlib.Path(os.environ['WORKBENCH_RUN_DIR'], 'direct.html').write_text('<html>direct</html>')"
            ),
            new_code_cell("1 / 0"),
            new_code_cell("print('still runs after a failure')"),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, folder / "fails.ipynb")
    run = run_demo(folder / "fails.ipynb", tmp_path / "runs", timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr[-2000:]
    assert "cells run     4/4 code cells" in run.stdout
    assert "ranks started 0" in run.stdout
    assert "error in code cell 3 ('1 / 0'): ZeroDivisionError: division by zero" in run.stdout
    assert sorted(p.name for p in run.run_dir.glob("*.html")) == ["board.html", "direct.html"]
    assert (run.run_dir / "board.html").read_text() == "<html>beside</html>"
    executed = run.notebook()
    assert executed.cells[-1].outputs[0]["text"] == "still runs after a failure\n"


def test_missing_notebook_is_a_usage_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "workbench.notebook.demo", str(tmp_path / "nope.ipynb"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "no notebook at" in proc.stderr


def test_summary_parsing_helpers():
    nb = new_notebook(
        cells=[
            new_code_cell(
                "%distrain start -n 2",
                outputs=[
                    nbformat.v4.new_output("stream", name="stdout", text="2 ranks up (gloo, local launcher) in 3.0 s\n")
                ],
            ),
            new_code_cell(
                "%distrain restart -n 3",
                outputs=[nbformat.v4.new_output("stream", name="stdout", text="3 ranks up again in 2.0 s\n")],
            ),
            new_code_cell(
                "boom()",
                outputs=[
                    nbformat.v4.new_output(
                        "error", ename="NameError", evalue="\x1b[31mname 'boom'\x1b[0m", traceback=[]
                    )
                ],
            ),
        ]
    )
    assert demo.ranks_started(nb) == 5
    (err,) = demo.cell_errors(nb)
    assert (err.number, err.ename, err.evalue, err.source) == (3, "NameError", "name 'boom'", "boom()")


def test_run_dirs_do_not_collide(tmp_path):
    a, b = demo.new_run_dir(tmp_path), demo.new_run_dir(tmp_path)
    assert a != b and a.is_dir() and b.is_dir()
    assert isinstance(a, pathlib.Path)
