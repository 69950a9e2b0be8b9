"""The quickstart notebook run in JupyterLab (headless Chromium): rank output reaches the page."""

from __future__ import annotations

import hashlib

import pytest

from .helpers import ROOT, open_notebook, outputs, run_all_cells, shot, wait_kernel_idle

NOTEBOOK = "notebooks/00_quickstart.ipynb"
pytestmark = [pytest.mark.browser, pytest.mark.timeout(400)]


def _digest() -> str:
    return hashlib.sha256((ROOT / NOTEBOOK).read_bytes()).hexdigest()


def test_run_all_shows_rank_output(page, lab):
    before = _digest()
    open_notebook(page, lab, NOTEBOOK)
    assert page.locator(".jp-Cell").count() >= 20
    run_all_cells(page)

    reduce_out = outputs(page, "[rank 1] all_reduce sum = 3").first
    reduce_out.wait_for(state="visible", timeout=180_000)
    lab.remember()  # the kernel and its ranks, to end by pid should they outlive the test
    assert outputs(page, "[rank 0] all_reduce sum = 3").count() == 1
    reduce_out.scroll_into_view_if_needed()
    path = shot(page, "lab_quickstart_all_reduce")
    assert path.stat().st_size > 20_000

    outputs(page, "ranks stopped").first.wait_for(state="visible", timeout=120_000)
    wait_kernel_idle(page)
    text = page.locator(".jp-Notebook").inner_text()
    for line in (
        "[rank 1] x is still here, now 30",
        "[rank 1] rank 1 says: set on rank 1 only",
        "pulled from the ranks: [0.125, 0.25]",
    ):
        assert line in text
    assert "[rank 0] rank 0 says" not in text
    # the status table and the per-rank tables render as HTML tables
    tables = page.locator(".jp-RenderedHTMLCommon table.dataframe")
    assert tables.count() == 3
    assert (
        page.locator(
            ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']", has_text="Traceback"
        ).count()
        == 0
    )
    tables.last.scroll_into_view_if_needed()
    shot(page, "lab_quickstart_done")
    assert _digest() == before, f"{NOTEBOOK} was modified by the browser run (autosave?)"
