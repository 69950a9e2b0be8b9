"""Notebook runs shared by several test modules (each runs at most once per session).

The quickstart is executed once, through the ``make demo`` entry point
(``python -m workbench.notebook.demo``, which drives nbclient with the ``python3`` kernel);
``test_demo`` checks the run and its summary, ``test_quickstart`` the notebook's outputs.

The labs, their student versions, the examples, the quick benchmarks and the saved notebooks
run through a :class:`RunPool`: two at a time, each kernel with its own state folder, a
test waiting for its own run and asserting on it.
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
# the executed copies the docs site renders (docs/_ext/course.py): executed once, by the suite
EXECUTED = ROOT / ".state" / "executed-notebooks"


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


def keep_executed(name: str, nb) -> None:
    """Keep notebook ``name``'s executed copy for the docs site (``make docs`` renders it
    instead of executing the notebook again); written whole or not at all."""
    EXECUTED.mkdir(parents=True, exist_ok=True)
    tmp = EXECUTED / f".{name}.tmp"
    nbformat.write(nb, tmp)
    tmp.replace(EXECUTED / name)


@functools.cache
def quickstart() -> DemoRun:
    """The quickstart notebook executed headless (once per test session)."""
    run = run_demo(QUICKSTART, RUNS, "--timeout", "180")
    if run.returncode == 0 and run.executed is not None and run.executed.is_file():
        keep_executed(QUICKSTART.name, nbformat.read(run.executed, as_version=4))
    return run


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


def private_env(folder: pathlib.Path) -> dict:
    """The environment of a notebook's kernel: its own Jupyter/IPython state under ``folder``
    (as the ``jupyter_dirs`` fixture makes for one test), also its ``WORKBENCH_RUN_DIR``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", WORKBENCH_RUN_DIR=str(folder))
    for var, sub in (
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("IPYTHONDIR", "ipython"),
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("MPLCONFIGDIR", "mpl"),
    ):
        (folder / sub).mkdir(parents=True, exist_ok=True)
        env[var] = str(folder / sub)
    return env


@dataclasses.dataclass
class NotebookRun:
    """One notebook executed headless: the executed copy, the failure that stopped it (if a
    cell raised), and the rank pids it printed, of which ``left`` were alive after it."""

    name: str
    nb: object
    error: BaseException | None
    seconds: float
    pids: list[int]
    left: list[int]
    state: pathlib.Path
    env: dict


def execute_notebook(nb, name: str, state: pathlib.Path, timeout: float = 180) -> NotebookRun:
    """Execute ``nb`` as a user would (nbclient, ``python3`` kernel, run from the repository
    root) with its own state folder; then give the ranks it printed 15 s to go (its ``%distrain
    stop`` or its kernel's exit stops them) and end, by pid, any still there."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    env = private_env(state)
    client = NotebookClient(nb, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(ROOT)}})
    t0 = time.perf_counter()
    error = None
    try:
        client.execute(env=env)
    except CellExecutionError as exc:
        error = exc
    except BaseException:
        end_lab_ranks(lab_rank_pids(outputs_text(nb)))
        raise
    seconds = time.perf_counter() - t0
    pids, left = ranks_after(nb)
    return NotebookRun(name, nb, error, seconds, pids, left, state, env)


def ranks_after(nb, grace: float = 15.0) -> tuple[list[int], list[int]]:
    """The rank pids an executed notebook printed, and those still alive ``grace`` seconds after
    its run (ended here, so that a failing test leaves no process behind)."""
    pids = lab_rank_pids(outputs_text(nb))
    deadline = time.monotonic() + grace
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = alive(pids)
    end_lab_ranks(left)
    return pids, left


# Runs (notebooks, scripts) at a time. One run mostly waits on a single process (a kernel or
# the controller starting, torch importing, a cell on two single-threaded ranks), so two keep
# both cores of a small machine busy where one leaves one idle.
AT_ONCE = 2


class RunPool:
    """Runs executed ``AT_ONCE`` at a time in threads, in the order submitted, each with a
    folder of its own under ``.state/test`` (removed on close); a test waits for its own."""

    def __init__(self, label: str):
        import tempfile
        from concurrent.futures import ThreadPoolExecutor

        from conftest import STATE

        STATE.mkdir(parents=True, exist_ok=True)
        self._tmp = tempfile.TemporaryDirectory(dir=STATE, prefix=f"{label}-")
        self._pool = ThreadPoolExecutor(AT_ONCE, thread_name_prefix=label)
        self._runs: dict = {}

    def folder(self, key: str) -> pathlib.Path:
        path = pathlib.Path(self._tmp.name) / key.removesuffix(".ipynb").removesuffix(".py")
        path.mkdir(parents=True, exist_ok=True)
        return path

    def submit(self, key: str, fn, *args, **kwargs) -> None:
        self._runs[key] = self._pool.submit(fn, *args, **kwargs)

    def submit_notebook(self, name: str, nb, timeout: float = 180) -> None:
        """Execute ``nb`` (see :func:`execute_notebook`) in its own state folder."""
        self.submit(name, execute_notebook, nb, name, self.folder(name), timeout)

    def result(self, key: str):
        return self._runs[key].result()

    def __contains__(self, key: str) -> bool:
        return key in self._runs

    def close(self) -> None:
        # runs not started yet are dropped (the module ended early); running ones finish
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_saved: RunPool | None = None


def _execute_saved(path: pathlib.Path, state: pathlib.Path, timeout: float) -> NotebookRun:
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"save {path.name} without outputs"
    return execute_notebook(nb, path.name, state, timeout)


def saved_notebook_run(request) -> NotebookRun:
    """The run of the ``NOTEBOOK`` of ``request``'s test module (``TIMEOUT`` seconds per cell).

    On the first call, every test module of the session that names a ``NOTEBOOK`` and a
    ``TIMEOUT`` has its notebook submitted, in the order the tests run, to one pool for the
    session: the notebooks of neighbouring modules then run two at a time."""
    global _saved
    if _saved is None:
        _saved = RunPool("notebooks")
        request.config.add_cleanup(_saved.close)
        for item in request.session.items:
            module = getattr(item, "module", None)
            path, timeout = getattr(module, "NOTEBOOK", None), getattr(module, "TIMEOUT", None)
            if path is not None and timeout is not None and path.name not in _saved:
                _saved.submit(path.name, _execute_saved, path, _saved.folder(path.name), timeout)
    return _saved.result(request.module.NOTEBOOK.name)


def selected(request, test: str, argname: str) -> list:
    """Values of the parameter ``argname`` of ``test`` (a test function of ``request``'s module)
    that this session runs, in the order it runs them: a pool then executes just those, in that order."""
    values = []
    for item in request.session.items:
        spec = getattr(item, "callspec", None)
        if (
            getattr(item, "module", None) is request.module
            and getattr(item, "originalname", None) == test
            and spec is not None
            and argname in spec.params
        ):
            values.append(spec.params[argname])
    return values


def executed(run: NotebookRun):
    """The executed notebook of ``run`` (the failure that stopped it is raised here), which
    ran with its IPython state in its own folder; kept for the docs site (:func:`keep_executed`)."""
    if run.error is not None:
        raise run.error
    assert run.env["IPYTHONDIR"].startswith(str(run.state))
    assert (pathlib.Path(run.env["IPYTHONDIR"]) / "profile_default").is_dir()
    keep_executed(run.name, run.nb)
    return run.nb


def check_lab_source(nb, ranks: int) -> None:
    """A lab as saved: no outputs, starts ``ranks`` gloo ranks and ends in ``%distrain stop``."""
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "save the lab without outputs"
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    assert any(f"%distrain start -n {ranks} --backend gloo --threads 1" in s for s in sources)
    assert sources[-1].strip() == "%distrain stop"


def check_lab_run(run: NotebookRun, ranks: int, expected_checks: int, needles) -> str:
    """Lab ``run`` as a student would see it: no cell raised, it ran in its own state folder,
    no rank process left, ``expected_checks`` "check passed" lines and every one of ``needles``
    in its outputs. Returns the outputs' text."""
    text = outputs_text(executed(run))
    assert len(run.pids) == ranks, f"the lab prints the {ranks} rank pids from %distrain status"
    assert run.left == [], f"{run.name} left rank processes behind: {run.left}"
    assert "ranks stopped" in text

    passed = [line for line in text.splitlines() if line.startswith("check passed")]
    assert len(passed) == expected_checks, (len(passed), expected_checks, passed)
    for needle in needles:
        assert needle in text, needle
    errors = [o for c in run.nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    print(f"{run.name}: {run.seconds:.1f} s")
    return text
