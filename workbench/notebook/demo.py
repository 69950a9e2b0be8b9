"""Run a notebook headless and keep what it produced: ``make demo``.

    python -m workbench.notebook.demo notebooks/00_quickstart.ipynb --out runs

executes the notebook with nbclient (:func:`run`) and prints a short summary: cells run, time,
ranks started and each failing cell. The exit status is nonzero when a cell failed or the
kernel could not run the notebook. Jupyter / IPython / ipyparallel state goes under ``.state/``
(:func:`state_env`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import os
import pathlib
import re
import shutil
import sys
import time

STATE_VARS = (
    ("IPYTHONDIR", "ipython"),
    ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"),
    ("JUPYTER_CONFIG_DIR", "jupyter/config"),
    ("JUPYTER_DATA_DIR", "jupyter/data"),
    ("MPLCONFIGDIR", "mpl"),
)
_STARTED = re.compile(r"^(\d+) ranks up\b", re.M)


@dataclasses.dataclass
class CellError:
    index: int  # position of the cell in the notebook (0-based, markdown included)
    number: int  # 1-based count among code cells, as a person counts them
    ename: str
    evalue: str
    source: str  # first line of the cell


@dataclasses.dataclass
class DemoResult:
    notebook: pathlib.Path  # the source notebook
    executed: pathlib.Path  # the executed copy under the run folder
    run_dir: pathlib.Path
    cells_run: int
    code_cells: int
    seconds: float
    ranks_started: int
    errors: list[CellError]
    exports: list[pathlib.Path]
    failure: str | None = None  # the kernel died, a cell timed out, ...

    @property
    def ok(self) -> bool:
        return not self.errors and self.failure is None

    def summary(self) -> str:
        lines = [
            f"notebook      {self.notebook}",
            f"executed copy {self.executed}",
            f"cells run     {self.cells_run}/{self.code_cells} code cells in {self.seconds:.1f} s",
            f"ranks started {self.ranks_started}",
        ]
        lines += [f"export        {p}" for p in self.exports]
        if self.failure:
            lines.append(f"FAILED        {self.failure}")
        for e in self.errors:
            lines.append(f"error in code cell {e.number} ({e.source!r}): {e.ename}: {e.evalue}")
        lines.append("OK" if self.ok else "FAILED: see the executed notebook for tracebacks")
        return "\n".join(lines)


def state_env(root: pathlib.Path) -> None:
    """Point Jupyter / IPython / ipyparallel state at ``root/.state`` where nothing else set it
    (``IPYTHONDIR`` / ``JUPYTER_*``: the Makefile sets them)."""
    for var, sub in STATE_VARS:
        if not os.environ.get(var):
            os.environ[var] = str(root / ".state" / sub)
        pathlib.Path(os.environ[var]).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")


def new_run_dir(out: pathlib.Path) -> pathlib.Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir, k = out / stamp, 1
    while run_dir.exists():
        k += 1
        run_dir = out / f"{stamp}-{k}"
    run_dir.mkdir(parents=True)
    return run_dir


def _html_files(folder: pathlib.Path, since: float) -> list[pathlib.Path]:
    out = []
    for p in sorted(folder.glob("*.html")):
        try:
            if p.is_file() and p.stat().st_mtime >= since:
                out.append(p)
        except OSError:
            pass
    return out


def cell_errors(nb) -> list[CellError]:
    errors, number = [], 0
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        number += 1
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                first = (cell.source.strip().splitlines() or [""])[0]
                errors.append(
                    CellError(index, number, output.get("ename", ""), _plain(output.get("evalue", "")), first)
                )
                break
    return errors


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text).strip().splitlines()[0] if text.strip() else ""


def ranks_started(nb) -> int:
    """Ranks brought up by ``%distrain start``/``restart`` cells (from their printed lines)."""
    total = 0
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "stream" and output.get("name") == "stdout":
                total += sum(int(n) for n in _STARTED.findall(output.get("text", "")))
    return total


def run(
    notebook: str | os.PathLike,
    out: str | os.PathLike = "runs",
    *,
    timeout: float = 600,
    kernel_name: str = "python3",
    startup_timeout: float = 120,
) -> DemoResult:
    """Execute ``notebook``; write the executed copy and exports under ``out/<timestamp>/``.

    The kernel starts in the notebook's folder, as in JupyterLab. A notebook that exports files
    can write them straight into the run folder: its path is in the kernel's environment as
    ``WORKBENCH_RUN_DIR``; HTML files it writes next to the notebook during the run (a dashboard
    export, for instance) are copied there too."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    notebook = pathlib.Path(notebook).resolve()
    run_dir = new_run_dir(pathlib.Path(out).resolve())
    nb = nbformat.read(notebook, as_version=4)
    cwd = notebook.parent
    os.environ["WORKBENCH_RUN_DIR"] = str(run_dir)  # the kernel inherits it
    client = NotebookClient(
        nb,
        timeout=timeout,
        startup_timeout=startup_timeout,
        kernel_name=kernel_name,
        allow_errors=True,
        resources={"metadata": {"path": str(cwd)}},
    )
    failure = None
    t0, wall0 = time.perf_counter(), time.time() - 1
    kernel_log = run_dir / "kernel.log"  # the kernel process's own stdout/stderr
    try:
        with open(kernel_log, "w") as log:
            client.execute(stdout=log, stderr=log)
    except CellTimeoutError as exc:
        failure = f"a cell ran past {timeout:g} s: {str(exc).splitlines()[0]}"
    except DeadKernelError as exc:
        failure = f"the kernel died: {exc} (kernel log: {kernel_log})"
    except Exception as exc:  # kernel could not start, ...
        failure = f"{type(exc).__name__}: {exc} (kernel log: {kernel_log})"
    seconds = time.perf_counter() - t0
    executed = run_dir / notebook.name
    nbformat.write(nb, executed)
    exports = []
    for src in _html_files(cwd, wall0):
        dst = run_dir / src.name
        if src.resolve() != dst.resolve():
            shutil.copy2(src, dst)
        exports.append(dst)
    exports += [p for p in _html_files(run_dir, 0) if p not in exports]
    code = [c for c in nb.cells if c.cell_type == "code"]
    return DemoResult(
        notebook=notebook,
        executed=executed,
        run_dir=run_dir,
        cells_run=sum(1 for c in code if c.get("execution_count") is not None),
        code_cells=len(code),
        seconds=seconds,
        ranks_started=ranks_started(nb),
        errors=cell_errors(nb),
        exports=exports,
        failure=failure,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.notebook.demo", description=__doc__.split("\n")[0])
    parser.add_argument("notebook", help="the notebook to execute")
    parser.add_argument("--out", default="runs", help="folder for run folders (default runs)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per cell (default 600)")
    parser.add_argument("--kernel", default="python3", help="kernel name (default python3)")
    args = parser.parse_args(argv)
    if not pathlib.Path(args.notebook).is_file():
        print(f"no notebook at {args.notebook}", file=sys.stderr)
        return 2
    state_env(pathlib.Path.cwd())
    result = run(args.notebook, args.out, timeout=args.timeout, kernel_name=args.kernel)
    print(result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
