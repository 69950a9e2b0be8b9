"""Notebook runs shared by several test modules (each runs at most once per session).

The quickstart is executed once, through the ``make demo`` entry point
(``python -m workbench.notebook.demo``, which drives nbclient with the ``python3`` kernel);
``test_demo`` checks the run and its summary, ``test_quickstart`` the notebook's outputs.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import subprocess
import sys
import time
from html.parser import HTMLParser

import nbformat

ROOT = pathlib.Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "notebooks" / "00_quickstart.ipynb"
RUNS = ROOT / ".state" / "test" / "runs"


@dataclasses.dataclass(frozen=True)
class DemoRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    executed: pathlib.Path | None
    run_dir: pathlib.Path | None

    def notebook(self):
        assert self.executed is not None and self.executed.is_file(), (
            f"the demo wrote no executed notebook\nstdout:\n{self.stdout}\nstderr:\n{self.stderr[-3000:]}"
        )
        return nbformat.read(self.executed, as_version=4)


from conftest import alive  # noqa: E402,F401  (re-exported for the notebook tests)


def run_demo(notebook: pathlib.Path, out: pathlib.Path, *extra: str, timeout: float = 400) -> DemoRun:
    """``python -m workbench.notebook.demo NOTEBOOK --out OUT`` in a subprocess, as ``make demo`` runs it."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "workbench.notebook.demo", str(notebook), "--out", str(out), *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    executed = None
    for line in proc.stdout.splitlines():
        if line.startswith("executed copy "):
            executed = pathlib.Path(line.removeprefix("executed copy ").strip())
    return DemoRun(
        proc.returncode,
        proc.stdout,
        proc.stderr,
        time.perf_counter() - t0,
        executed,
        executed.parent if executed else None,
    )


@functools.cache
def quickstart() -> DemoRun:
    """The quickstart notebook executed headless (once per test session)."""
    return run_demo(QUICKSTART, RUNS, "--timeout", "180")


def execute_saved_notebook(path: pathlib.Path, timeout: float):
    """Read a notebook of the repository, check it was saved without outputs, execute it
    with nbclient (``python3`` kernel, run from the repository root) and return it."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"save {path.name} without outputs"
    NotebookClient(nb, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(ROOT)}}).execute()
    return nb


def outputs_text(nb) -> str:
    """Every stream and text/plain output of an executed notebook, joined."""
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("text", ""))
            out.append(o.get("data", {}).get("text/plain", ""))
    return "\n".join(out)


def code_cell(nb, startswith: str):
    """The code cell whose source starts with ``startswith`` (exactly one)."""
    found = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(startswith)]
    assert len(found) == 1, f"{len(found)} code cells start with {startswith!r}"
    return found[0]


def stream_text(cell, name: str = "stdout") -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream" and o.get("name") == name)


def errors(nb) -> list[str]:
    return [
        f"{c.source.splitlines()[0]!r}: {o.get('ename')}: {o.get('evalue')}"
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "error"
    ]


class _Table(HTMLParser):
    """The cells of the HTML tables in a fragment, row by row."""

    def __init__(self):
        super().__init__()
        self.rows: list[list[str]] = []
        self.body: list[bool] = []  # per row: inside <tbody>
        self._cell: list[str] | None = None
        self._in_body = False

    def handle_starttag(self, tag, attrs):
        if tag == "tbody":
            self._in_body = True
        elif tag == "tr":
            self.rows.append([])
            self.body.append(self._in_body)
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "tbody":
            self._in_body = False
        elif tag in ("td", "th") and self._cell is not None and self.rows:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def table_column(html: str, column: str) -> list[str]:
    """Values of ``column`` in a pandas DataFrame's HTML table (header row found by name)."""
    parser = _Table()
    parser.feed(html)
    header = next(r for r, body in zip(parser.rows, parser.body) if not body and column in r)
    i = header.index(column)
    return [r[i] for r, body in zip(parser.rows, parser.body) if body and len(r) == len(header)]


def lab_rank_pids(text: str) -> list[int]:
    """The rank pids a lab prints (``rank pids: [...]``), so a test can check none is left."""
    import ast
    import re

    m = re.search(r"rank pids: (\[[0-9, ]*\])", text)
    return ast.literal_eval(m.group(1)) if m else []


def end_lab_ranks(pids) -> None:
    """After a failed run: end the rank processes a lab started (by pid, children first)."""
    import psutil

    for pid in alive(pids):
        try:
            proc = psutil.Process(pid)
            for child in proc.children(recursive=True):
                child.kill()
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def run_lab(nb, name: str, ranks: int, expected_checks: int, needles) -> str:
    """Execute lab ``name`` (``nb``, read from notebooks/) headless and check it as a student
    would see it: saved without outputs, starts ``ranks`` gloo ranks and ends in ``%distrain
    stop``; no cell raised, no rank process left, ``expected_checks`` "check passed" lines and
    every one of ``needles`` in its outputs. Returns the outputs' text."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "save the lab without outputs"
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    assert any(f"%distrain start -n {ranks} --backend gloo --threads 1" in s for s in sources)
    assert sources[-1].strip() == "%distrain stop"

    t0 = time.perf_counter()
    client = NotebookClient(nb, kernel_name="python3", timeout=180, resources={"metadata": {"path": str(ROOT)}})
    try:
        client.execute()
    except CellExecutionError:
        end_lab_ranks(lab_rank_pids(outputs_text(nb)))
        raise
    seconds = time.perf_counter() - t0
    text = outputs_text(nb)

    pids = lab_rank_pids(text)
    assert len(pids) == ranks, f"the lab prints the {ranks} rank pids from %distrain status"
    deadline = time.monotonic() + 15
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = alive(pids)
    end_lab_ranks(left)
    assert left == [], f"{name} left rank processes behind: {left}"
    assert "ranks stopped" in text

    passed = [line for line in text.splitlines() if line.startswith("check passed")]
    assert len(passed) == expected_checks, (len(passed), expected_checks, passed)
    for needle in needles:
        assert needle in text, needle
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    print(f"{name}: {seconds:.1f} s")
    return text
