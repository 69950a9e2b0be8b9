"""The labs as course pages: each notebook of ``notebooks/`` rendered executed, its figures drawn.

The executed copies come from the suite's own runs (``.state/executed-notebooks/``, written by
``tests/notebook_runs.keep_executed`` when a notebook's run passed), so a notebook is executed
once, not twice. A copy is used only while its code cells equal the notebook's; a notebook
without one is executed here (``DOCS_EXECUTE``: ``missing``, the default; ``none``; or a comma
list of notebook names), else rendered unexecuted with a note saying so.

Plotly figures are turned into static HTML that draws them with the plotly.js the ``plotly``
package ships (copied into ``_static``), so a page needs nothing from the network: a
``application/vnd.plotly.v1+json`` output, and a ``FigureWidget`` from the widget state the run
saved (a widget needs a live kernel; its last state is what the page shows).
"""

from __future__ import annotations

import ast
import copy
import html
import json
import os
import pathlib
import re
import shutil
import tempfile

import nbformat
from sphinx.util import logging

from workbench.labs.student import SOLUTION_TAG

LOG = logging.getLogger(__name__)

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
EXECUTED = ROOT / ".state" / "executed-notebooks"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
PLOTLY_JS = "plotly.min.js"


def code_sources(nb) -> list[str]:
    return [c.source for c in nb.cells if c.cell_type == "code"]


def executed_copy(path: pathlib.Path, folder: pathlib.Path = EXECUTED):
    """The suite's executed copy of notebook ``path``, or None when there is none or it is stale."""
    copy_path = folder / path.name
    if not copy_path.is_file():
        return None
    executed = nbformat.read(copy_path, as_version=4)
    source = nbformat.read(path, as_version=4)
    return executed if code_sources(executed) == code_sources(source) else None


def keep(name: str, nb, folder: pathlib.Path = EXECUTED) -> None:
    """Keep an executed copy beside the suite's (written whole or not at all)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    nbformat.write(nb, tmp)
    tmp.replace(folder / name)


def _rank_pids(nb) -> list[int]:
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            m = re.search(r"rank pids: (\[[0-9, ]*\])", out.get("text", "") or "")
            if m:
                return ast.literal_eval(m.group(1))
    return []


def execute(path: pathlib.Path, timeout: float = 300):
    """Execute notebook ``path`` as ``make demo`` would (its own Jupyter state in a temporary
    folder); rank processes it printed that outlive it are ended by pid."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="docs-exec-") as tmp:
        env = dict(os.environ, OMP_NUM_THREADS="1", WORKBENCH_RUN_DIR=tmp)
        for var, sub in (
            ("JUPYTER_RUNTIME_DIR", "runtime"),
            ("IPYTHONDIR", "ipython"),
            ("JUPYTER_CONFIG_DIR", "config"),
            ("JUPYTER_DATA_DIR", "data"),
            ("MPLCONFIGDIR", "mpl"),
        ):
            pathlib.Path(tmp, sub).mkdir()
            env[var] = str(pathlib.Path(tmp, sub))
        client = NotebookClient(nb, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(ROOT)}})
        try:
            client.execute(env=env)
        finally:
            _end_ranks(_rank_pids(nb))
    return nb


def _end_ranks(pids: list[int], grace: float = 15.0) -> None:
    """Give the ranks a notebook printed ``grace`` seconds to end (its ``%distrain stop`` or its
    kernel's exit ends them), then end those left, by pid, children first."""
    import psutil

    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, left = psutil.wait_procs(procs, timeout=grace)
    for proc in left:
        try:
            for child in proc.children(recursive=True):
                child.kill()
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def figure_html(figure: dict, key: str) -> str:
    """A plotly figure as a div and the call that draws it (plotly.js is loaded by the page)."""
    data = json.dumps({"data": figure.get("data", []), "layout": figure.get("layout", {})}, sort_keys=True)
    data = data.replace("</", "<\\/")
    return (
        f'<div class="plotly-figure" id="{key}"></div>\n'
        f'<script type="application/json" id="{key}-json">{data}</script>\n'
        # the theme loads its scripts (plotly.js among them) after the page's body: draw once they ran
        f"<script>document.addEventListener('DOMContentLoaded',function(){{"
        f"var f=JSON.parse(document.getElementById('{key}-json').textContent);"
        f"Plotly.newPlot('{key}',f.data,f.layout,{{responsive:true,displaylogo:false}});}});</script>"
    )


def _with_buffers(model: dict) -> dict:
    """The model's state with its binary buffers put back in place, as lists: a figure's numpy
    arrays travel as buffers (``{"dtype", "shape"}`` in the state, the bytes beside it)."""
    import base64

    import numpy as np

    body = copy.deepcopy(model.get("state", {}))
    for buffer in model.get("buffers", []):
        *where, last = buffer.get("path", [])
        node = body
        try:
            for key in where:
                node = node[key]
        except (KeyError, IndexError, TypeError):
            continue  # a buffer of a transient edit message, no longer in the state
        if last != "buffer" or not isinstance(node, dict) or "dtype" not in node:
            continue
        raw = base64.b64decode(buffer["data"]) if buffer.get("encoding") == "base64" else bytes(buffer["data"])
        values = np.frombuffer(raw, dtype=node["dtype"]).reshape(node.get("shape", [-1])).tolist()
        parent = body
        for key in where[:-1]:
            parent = parent[key]
        parent[where[-1]] = values
    return body


def _widget_parts(model_id: str, state: dict, seen: set | None = None) -> list[dict | str]:
    """What a widget shows, its children's included, from the saved widget state: plotly
    figures (dicts) and the HTML of HTML/Label widgets (a dashboard's status line), in order."""
    seen = set() if seen is None else seen
    if model_id in seen or model_id not in state:
        return []
    seen.add(model_id)
    model = state[model_id]
    body = _with_buffers(model)
    if "_widget_data" in body and "_widget_layout" in body:  # plotly >= 6: FigureWidget is an anywidget
        return [{"data": body.get("_widget_data", []), "layout": body.get("_widget_layout", {})}]
    if model.get("model_name") == "FigureModel":  # plotly 5's ipywidgets model
        return [{"data": body.get("_data", []), "layout": body.get("_layout", {})}]
    if model.get("model_name") == "HTMLModel" and body.get("value"):
        return [str(body["value"])]
    if model.get("model_name") == "LabelModel" and body.get("value"):
        return [f"<p>{html.escape(str(body['value']))}</p>"]
    parts: list[dict | str] = []
    for child in body.get("children", []):
        if isinstance(child, str) and child.startswith("IPY_MODEL_"):
            parts += _widget_parts(child.removeprefix("IPY_MODEL_"), state, seen)
    return parts


def _plotly_bootstrap(data: dict) -> bool:
    return PLOTLY_MIME not in data and "window.PlotlyConfig" in str(data.get("text/html", ""))


def static_figures(nb, stem: str) -> int:
    """Replace plotly outputs (mimetype and FigureWidget) by static HTML; drop the widget state
    (a page would otherwise load the widget manager from the network). Returns the figures made."""
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    count = 0
    for cell in nb.cells:
        # plotly's notebook renderer bootstrap (it points at plotly.js and MathJax on CDNs): not content
        if "outputs" in cell:
            cell.outputs = [o for o in cell.outputs if not _plotly_bootstrap(o.get("data") or {})]
        for out in cell.get("outputs", []):
            data = out.get("data")
            if not data:
                continue
            parts: list[dict | str] = []
            if PLOTLY_MIME in data:
                parts = [data.pop(PLOTLY_MIME)]
            elif WIDGET_VIEW in data:
                parts = _widget_parts(data.pop(WIDGET_VIEW).get("model_id", ""), state)
            if any(isinstance(part, dict) for part in parts):
                shown = []
                for part in parts:
                    if isinstance(part, dict):
                        count += 1
                        part = figure_html(part, f"fig-{stem}-{count}")
                    shown.append(part)
                data["text/html"] = "\n".join(shown)
    nb.metadata.pop("widgets", None)
    return count


def _title_index(nb) -> int:
    """The index after the notebook's title cell (a markdown cell starting with '# ')."""
    first = nb.cells[0] if nb.cells else None
    return 1 if first is not None and first.cell_type == "markdown" and first.source.lstrip().startswith("# ") else 0


def course_notebook(path: pathlib.Path, nb, origin: str | None, student: pathlib.Path | None, out: pathlib.Path) -> int:
    """Write the page version of ``nb`` (notebook ``path``) to ``out``; returns its figure count."""
    nb = copy.deepcopy(nb)
    count = static_figures(nb, path.stem)
    for cell in nb.cells:  # an exercise's answer behind a click; its question and check stay in view
        tags = cell.metadata.get("tags", [])
        if SOLUTION_TAG in tags and "hide-input" not in tags:
            cell.metadata["tags"] = [*tags, "hide-input"]
    links = [f"{{download}}`the notebook <{os.path.relpath(path, out.parent)}>`"]
    if student is not None:
        links.insert(0, f"{{download}}`the student version <{os.path.relpath(student, out.parent)}>` (answers blanked)")
    note = "Download " + " or ".join(links) + "."
    if origin is not None:
        ranks = "CPU ranks on gloo, " if any("%distrain start" in c for c in code_sources(nb)) else ""
        note += f" The outputs below are from {origin} ({ranks}a 2-core machine); its figures are interactive."
    else:
        note += (
            "\n\n```{note}\nThis page shows the notebook unexecuted: this build had no executed copy "
            "(`make test` writes them; `make docs` executes the missing ones).\n```"
        )
    nb.cells.insert(_title_index(nb), nbformat.v4.new_markdown_cell(note))
    nbformat.write(nb, out)
    return count


def _wanted(name: str, setting: str) -> bool:
    if setting == "missing":
        return True
    if setting == "none":
        return False
    return name.removesuffix(".ipynb") in {s.strip().removesuffix(".ipynb") for s in setting.split(",")}


def prepare_course(out: pathlib.Path, setting: str = "missing", log=print) -> dict[str, dict]:
    """Write every notebook's page into ``out`` (and the labs' student versions into
    ``out/student``); returns, per notebook, whether it is executed and where it came from."""
    from workbench.labs.build import build

    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.ipynb"):
        old.unlink()
    student_dir = out / "student"
    shutil.rmtree(student_dir, ignore_errors=True)
    students = {b.lab: b.student for b in build(NOTEBOOKS, student_dir)}
    report = {}
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb, origin = executed_copy(path), "the test suite's run of it"
        if nb is None and _wanted(path.name, setting):
            log(f"course: executing {path.name} (no executed copy from the suite)")
            nb, origin = execute(path), "the site build's run of it"
            keep(path.name, nb)  # the next build (or a suite run's copy, which replaces it) uses it
        executed = nb is not None
        if nb is None:
            nb, origin = nbformat.read(path, as_version=4), None
        figures = course_notebook(path, nb, origin, students.get(path.name), out / path.name)
        report[path.name] = {"executed": executed, "origin": origin or "not executed", "figures": figures}
    return report


# --- Sphinx -------------------------------------------------------------------------------


def _on_builder_inited(app) -> None:
    out = pathlib.Path(app.srcdir) / "course" / "notebooks"
    report = prepare_course(out, os.environ.get("DOCS_EXECUTE", "missing"), log=LOG.info)
    app.env.course_pages = {f"course/notebooks/{n.removesuffix('.ipynb')}": r for n, r in report.items()}
    for name, r in report.items():
        LOG.info(f"course: {name}: {r['origin']}, {r['figures']} figures")


def _on_page_context(app, pagename, templatename, context, doctree) -> None:
    pages = getattr(app.env, "course_pages", {})
    if pages.get(pagename, {}).get("figures"):
        app.add_js_file(PLOTLY_JS)


def _on_build_finished(app, exception) -> None:
    if exception is None and app.builder.format == "html":
        import plotly

        src = pathlib.Path(plotly.__file__).parent / "package_data" / PLOTLY_JS
        shutil.copyfile(src, pathlib.Path(app.outdir) / "_static" / PLOTLY_JS)


def setup(app):
    app.connect("builder-inited", _on_builder_inited)
    app.connect("html-page-context", _on_page_context)
    app.connect("build-finished", _on_build_finished)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
