"""Helpers for the JupyterLab browser tests (fixtures are in ``conftest.py``)."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
STATE = ROOT / ".state" / "browser"
ARTIFACTS = ROOT / "test-artifacts"


def shot(page, name: str) -> pathlib.Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


def open_notebook(page, lab, path: str) -> None:
    """Open ``path`` in Lab and wait until its cells are shown and its kernel is idle."""
    page.goto(lab.url(path))
    page.locator(".jp-Notebook .jp-Cell").nth(1).wait_for(state="visible", timeout=60_000)
    wait_kernel_idle(page, timeout=120_000)


def wait_kernel_idle(page, timeout: float = 120_000) -> None:
    """Wait for the status bar to read ``Python 3 (ipykernel) | Idle``."""
    page.get_by_text(re.compile(r"^Python 3 \(ipykernel\) \| Idle$")).first.wait_for(state="visible", timeout=timeout)


def run_menu(page, item: str) -> None:
    """Click ``item`` in Lab's Run menu (e.g. ``Run All Cells``)."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-content .lm-Menu-itemLabel").get_by_text(item, exact=True).click()


def run_all_cells(page) -> None:
    """Run > Run All Cells, through Lab's menu bar."""
    run_menu(page, "Run All Cells")


def select_cell(page, text: str):
    """Select the (first) cell whose text contains ``text``, by clicking its prompt."""
    cell = page.locator(".jp-Notebook .jp-Cell", has_text=text).first
    cell.locator(".jp-InputPrompt").click()
    return cell


def run_cell(page, text: str):
    """Select the cell containing ``text`` and run it with the toolbar's run button."""
    cell = select_cell(page, text)
    page.locator(".jp-NotebookPanel-toolbar [data-command='notebook:run-cell-and-select-next']").click()
    return cell


def outputs(page, text: str):
    return page.locator(".jp-OutputArea-output", has_text=text)


def write_notebook(path: pathlib.Path, cells: list[str]) -> None:
    """A notebook of code cells ``cells`` (no outputs) on the ``python3`` kernel."""
    import json

    nb = {
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": src, "outputs": [], "execution_count": None}
            for src in cells
        ],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
