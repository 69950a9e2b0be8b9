"""notebooks/01_train_and_watch.ipynb in JupyterLab: the live loss plot renders and grows.

The notebook's first run is 40 steps (well under a second on CPU), shorter than it takes
a headless browser on a small machine to load plotly.js and draw the dashboard; so the test
runs a copy (under ``.state/browser/``) whose first run has ``--steps 1000`` (~20 s: 400
were enough until the trainer shed most of its fixed cost per step), everything else
unchanged. Run > Run All Cells, then watch the dashboard as a person would: plotly draws a
widget only once it is scrolled into view, so the test keeps the first plot (the loss) in
view and samples its points: they must grow while the run trains.
"""

from __future__ import annotations

import hashlib
import time

import nbformat
import pytest

from .helpers import ROOT, STATE, open_notebook, outputs, run_all_cells, shot, wait_kernel_idle

NOTEBOOK = "notebooks/01_train_and_watch.ipynb"
FIRST_RUN = "%distrain train start --steps 40 "
LONGER_RUN = "%distrain train start --steps 1000 "
pytestmark = [pytest.mark.browser, pytest.mark.timeout(500)]

# the dashboard's plotly graph divs: per panel (trace meta "<panel>:<name>"), its traces and
# data points; and the lines drawn
PLOTS = """() => [...document.querySelectorAll('.jp-OutputArea-output .js-plotly-plot')]
  .map(p => {
    const loss = (p.data || []).filter(t => typeof t.meta === 'string' && t.meta.startsWith('loss:'));
    return {loss_traces: loss.length,
            points: loss.reduce((n, t) => n + ((t.x && t.x.length) || 0), 0),
            lines: p.querySelectorAll('.scatterlayer .trace path.js-line').length};
  })"""


def loss_plots(page) -> list[dict]:
    return [p for p in page.evaluate(PLOTS) if p["loss_traces"]]


def _longer_copy() -> str:
    nb = nbformat.read(ROOT / NOTEBOOK, as_version=4)
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(FIRST_RUN)]
    assert len(cells) == 1, f"{NOTEBOOK} has no cell starting with {FIRST_RUN!r}: update this test"
    cells[0].source = cells[0].source.replace(FIRST_RUN, LONGER_RUN, 1)
    path = STATE / "train_and_watch" / "01_train_and_watch_longer.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path.relative_to(ROOT).as_posix()


def test_loss_plot_renders_and_gains_points(page, lab):
    before = hashlib.sha256((ROOT / NOTEBOOK).read_bytes()).hexdigest()
    open_notebook(page, lab, _longer_copy())
    run_all_cells(page)
    outputs(page, "ranks up").first.wait_for(state="visible", timeout=120_000)
    lab.remember()  # the kernel and its ranks, to end by pid should they outlive the test
    dashboard = outputs(page, "training run-").first
    dashboard.wait_for(state="visible", timeout=120_000)

    # watch the dashboard as a person would: keep the loss plot in view while the runs go on
    counts: list[int] = []
    done = outputs(page, "ranks stopped").first
    plots = page.locator(".jp-OutputArea-output .js-plotly-plot")
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        target = plots.first if plots.count() else dashboard
        try:
            target.scroll_into_view_if_needed(timeout=2_000)
        except Exception:
            pass
        found = loss_plots(page)
        counts.append(found[0]["points"] if found else 0)
        if counts[-1] and counts.count(counts[-1]) == 1 and sum(1 for c in counts if c) == 1:
            shot(page, "lab_train_and_watch_live")  # the first time the loss plot has points
        if len(counts) % 10 == 0 and done.is_visible():
            break
        time.sleep(0.1)
    assert done.is_visible(), "the notebook did not reach `%distrain stop`"
    wait_kernel_idle(page)

    grew = [(a, b) for a, b in zip(counts, counts[1:]) if b > a > 0]
    changes = [c for i, c in enumerate(counts) if i == 0 or c != counts[i - 1]]
    problems = outputs(page, "redraw failed").all_inner_texts()
    assert grew, (
        f"the loss plot never gained points while the run trained: {changes}; "
        f"dashboard messages: {problems}; browser console errors: {page.console_errors[-5:]}"
    )
    final = loss_plots(page)
    assert final and final[0]["loss_traces"] >= 3 and final[0]["lines"] >= 2, final  # per rank + mean

    text = page.locator(".jp-Notebook").inner_text()
    for line in ("DDP run: {", "paused: {", "FSDP2 run: {", "own loop rows: 20", "exported dashboard: True"):
        assert line in text, f"{line!r} is not on the page"
    assert (
        page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']", has_text="Traceback"
        ).count()
        == 0
    )
    plots.first.scroll_into_view_if_needed()
    shot(page, "lab_train_and_watch")
    assert page.js_errors == [], page.js_errors
    assert hashlib.sha256((ROOT / NOTEBOOK).read_bytes()).hexdigest() == before, f"{NOTEBOOK} was modified"
    print("loss plot points as they changed:", changes)
