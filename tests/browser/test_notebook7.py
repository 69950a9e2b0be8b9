"""The workbench's extension in Notebook 7 (the ``notebook`` package): ranks panel and status item.

Notebook 7 has no status bar and no left tab bar: the extension puts its status item in the
notebook's header and the ranks panel in Notebook 7's right side panel (opened by clicking
the item). The same server reads GPU memory and utilisation through NVML; no GPU can run
here, so NVML is the stand-in of tests/nvml_standin.py, installed as ``pynvml`` in the server
process only, reporting the ranks' pids; its values must reach the REST reply and the panel.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time

import pytest

from .conftest import _free_port, _need_browser, browsing, installed_env, jupyter_cmd, serve
from .helpers import ROOT, STATE, write_notebook

HERE = STATE / "nb7"
NOTEBOOK = HERE / "ranks_nb7.ipynb"
NVML = HERE / "nvml.json"
CELLS = [
    "%load_ext workbench\n%distrain start -n 2",
    "import json, workbench\nprint('PIDS', json.dumps([r['pid'] for r in workbench.status()]))",
]


@pytest.fixture(scope="module")
def notebook7():
    """``jupyter notebook`` (Notebook 7) with the installed extensions and NVML's stand-in."""
    _need_browser()
    pytest.importorskip("notebook", minversion="7", reason="Notebook 7 is not installed (pip install -e '.[test]')")
    env = installed_env(HERE)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    env["WORKBENCH_NVML_STANDIN"] = str(NVML)  # absent until the ranks are up: "no driver" till then
    write_notebook(NOTEBOOK, CELLS)
    port, token = _free_port(), secrets.token_hex(16)
    log = HERE / "jupyter-notebook.log"
    cmd = jupyter_cmd(
        "notebook",
        port,
        token,
        '--ServerApp.jpserver_extensions={"nvml_standin": True}',  # the installed workbench.labserver beside it
        f"--FileCheckpoints.checkpoint_dir={HERE / 'checkpoints'}",
        f"--JupyterNotebookApp.user_settings_dir={HERE / 'settings'}",
        f"--JupyterNotebookApp.workspaces_dir={HERE / 'workspaces'}",
    )
    with serve(cmd, env, port, token, log, "jupyter notebook") as server:
        yield server


@pytest.fixture
def nb7_page(request, notebook7, playwright_driver):
    with browsing(playwright_driver, notebook7, HERE / "chromium", f"nb7-{request.node.name}") as pg:
        yield pg


def _ranksets(server) -> list[dict]:
    return server.rest("workbench/ranksets")["ranksets"]


def _wait_kernel_idle(server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        kernels = server.kernels()
        if kernels and all(k["execution_state"] == "idle" for k in kernels):
            return
        assert time.monotonic() < deadline, f"the kernel is not idle after {timeout} s: {kernels}"
        time.sleep(0.3)


def test_notebook7_shows_the_ranks_and_their_gpu_use(nb7_page, notebook7):
    page, server = nb7_page, notebook7
    page.goto(f"{server.base}/notebooks/{NOTEBOOK.relative_to(ROOT).as_posix()}?token={server.token}")
    cells = page.locator(".jp-Notebook .jp-Cell")
    cells.nth(1).wait_for(state="visible", timeout=60_000)
    assert "/notebooks/" in page.url and page.locator("#jp-LabShell").count() == 0  # Notebook 7, not Lab
    _wait_kernel_idle(server, 120)
    # before the ranks: the item is empty, and without NVML's state file no GPU columns appear
    item = page.locator(".wb-StatusItem")
    assert item.count() == 1 and item.inner_text().strip() == ""

    cells.first.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")  # %distrain start -n 2
    page.keyboard.press("Shift+Enter")  # PIDS
    out = page.locator(".jp-OutputArea-output", has_text="PIDS [")
    out.wait_for(timeout=240_000)
    pids = json.loads(out.inner_text().split("PIDS", 1)[1].strip())
    assert len(pids) == 2

    # the status item in the header: this notebook's rank set
    item.filter(has_text="2 ranks").wait_for(timeout=10_000)
    rest = _ranksets(server)
    assert [r["pid"] for r in rest[0]["ranks"]] == pids
    assert all(r["gpu"] is None for r in rest[0]["ranks"])  # no NVML (no driver): no GPU values

    # clicking it opens the ranks panel (Notebook 7's right side panel)
    item.click()
    panel = page.locator("#workbench-ranks")
    rows = panel.locator(".wb-RankSet[data-state='running'] .wb-RankRow")
    rows.nth(1).wait_for(state="visible", timeout=15_000)
    assert [int(rows.nth(i).get_attribute("data-pid")) for i in range(2)] == pids
    headers = panel.locator(".wb-RankTable th").all_inner_texts()
    assert "GPU MB" not in headers and "GPU %" not in headers

    # NVML (the stand-in) now reports the ranks' GPU memory and the device's utilisation
    NVML.write_text(json.dumps({"util": 41, "processes": {str(pids[0]): 2048, str(pids[1]): 3072}}))
    page.wait_for_function(
        "() => [...document.querySelectorAll('#workbench-ranks .wb-RankTable th')].some(t => t.textContent === 'GPU MB')",
        timeout=10_000,
    )
    gpu = [r["gpu"] for r in _ranksets(server)[0]["ranks"]]
    assert gpu == [{"device": 0, "memory_mb": 2048.0, "util": 41}, {"device": 0, "memory_mb": 3072.0, "util": 41}]
    headers = panel.locator(".wb-RankTable th").all_inner_texts()
    at = headers.index("GPU MB")
    assert headers[at + 1] == "GPU %"
    for i, mb in enumerate(("2048", "3072")):
        tds = rows.nth(i).locator("td").all_inner_texts()
        assert tds[at] == mb and tds[at + 1] == "41", tds
    assert re.match(r"^2 ranks", item.inner_text())
    assert _unexpected(page.js_errors) == [], page.js_errors


# Notebook 7.6 under JupyterLab 4.6 throws this from its own keyboard-shortcuts plugin on every
# page load, with or without this extension (seen with the extension unlinked): not ours.
NOTEBOOK7_OWN = "Cannot read properties of undefined (reading 'schema')"


def _unexpected(errors: list[str]) -> list[str]:
    return [e for e in errors if not (e.startswith(NOTEBOOK7_OWN) and "/static/notebook/notebook_core." in e)]
