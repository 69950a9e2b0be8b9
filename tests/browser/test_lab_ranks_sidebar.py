"""The workbench's JupyterLab extension in a real JupyterLab under a non-root base URL.

The extensions under test are the ones installed in the environment, as ``make lab`` serves
them (``make`` links this tree's build into the venv and installs the server extension's switch
there). One notebook drives a whole rank set's life: start, live pane during a long cell,
interrupt, SIGKILL, stop from the sidebar.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import time
import urllib.error
import urllib.request

import pytest
from conftest import alive as _alive

from .conftest import _free_port, _need_browser, browsing, installed_env, jupyter_cmd, serve
from .helpers import ROOT, STATE, run_cell, shot, wait_kernel_idle, write_notebook

BASE = "/hub/user/wb/"
HERE = STATE / "labext"
NOTEBOOK = HERE / "ranks_sidebar.ipynb"
CELLS = [
    "%load_ext workbench\n%distrain start -n 2",
    "import json, workbench\nprint('PIDS', json.dumps([r['pid'] for r in workbench.status()]))",
    "%distrain train start --model tiny --steps 100000 --no-dashboard",
    "import time\ntime.sleep(15)\nprint('SLEPT')",
    "%%distrain\nimport time\nwhile True:\n    time.sleep(0.05)",
    "%distrain status",
]


@pytest.fixture(scope="module")
def lab_base():
    """JupyterLab under ``BASE`` with the installed Lab and server extensions."""
    _need_browser()
    env = installed_env(HERE)
    write_notebook(NOTEBOOK, CELLS)
    port, token = _free_port(), secrets.token_hex(16)
    log = HERE / "jupyter-lab.log"
    cmd = jupyter_cmd(
        "jupyterlab",
        port,
        token,
        f"--ServerApp.base_url={BASE}",
        f"--FileCheckpoints.checkpoint_dir={HERE / 'checkpoints'}",
        f"--LabApp.user_settings_dir={HERE / 'settings'}",
        f"--LabApp.workspaces_dir={HERE / 'workspaces'}",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    )
    with serve(cmd, env, port, token, log, "jupyter lab", base=f"http://127.0.0.1:{port}{BASE.rstrip('/')}") as server:
        yield server


@pytest.fixture
def lab_page(request, lab_base, playwright_driver):
    with browsing(playwright_driver, lab_base, HERE / "chromium", f"labext-{request.node.name}") as pg:
        yield pg


def _ranks_api(lab, token: bool = True):
    return lab.rest("workbench/ranksets", token=token)["ranksets"]


def _output(page, cell_text: str) -> str:
    cell = page.locator(".jp-Notebook .jp-Cell", has_text=cell_text).first
    return cell.locator(".jp-OutputArea").inner_text()


def _wait_output(page, cell_text: str, pattern: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = _output(page, cell_text)
        if re.search(pattern, text):
            return text
        assert time.monotonic() < deadline, f"no {pattern!r} in the output of {cell_text!r}: {text!r}"
        time.sleep(0.3)


def _confirm(page, action: str) -> None:
    page.locator(f".wb-RankSet[data-state='running'] button[data-action='{action}']").first.click()
    page.locator(".jp-Dialog .jp-mod-accept").click()


def test_sidebar_and_live_pane_follow_the_ranks_while_the_kernel_is_busy(lab_page, lab_base):
    page, lab = lab_page, lab_base
    page.goto(lab.url(NOTEBOOK.relative_to(ROOT).as_posix()))
    page.locator(".jp-Notebook .jp-Cell").nth(1).wait_for(state="visible", timeout=60_000)
    wait_kernel_idle(page)
    assert "/hub/user/wb/lab" in page.url

    # the command palette inserts the cell that starts ranks
    page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-InputPrompt").click()
    page.keyboard.press("Control+Shift+C")
    page.locator(".lm-CommandPalette-input").fill("Workbench: insert")
    page.locator(".lm-CommandPalette-item", has_text="insert a cell that starts 2 ranks").first.click()
    cells = page.locator(".jp-Notebook .jp-Cell", has_text="%distrain start -n 2")
    assert cells.count() == 2 and "%load_ext workbench" in cells.first.inner_text()

    # start: the sidebar lists the two ranks with the pids `status` reports
    run_cell(page, "%distrain start -n 2")
    wait_kernel_idle(page, timeout=180_000)
    run_cell(page, "print('PIDS'")
    pids = json.loads(_wait_output(page, "print('PIDS'", r"PIDS \[.*\]").split("PIDS", 1)[1].strip())
    assert len(pids) == 2
    page.locator(".lm-TabBar-tab[data-id='workbench-ranks']").click()
    rows = page.locator(".wb-RankSet[data-state='running'] .wb-RankRow")
    rows.nth(1).wait_for(timeout=15_000)
    assert rows.count() == 2
    assert [int(rows.nth(i).get_attribute("data-pid")) for i in range(2)] == pids
    # no NVML here: no GPU columns, no GPU values, no error
    assert "GPU MB" not in page.locator(".wb-RankSet[data-state='running'] .wb-RankTable th").all_inner_texts()
    assert all(r["gpu"] is None for r in _ranks_api(lab)[0]["ranks"])

    # refused without the token: REST and websocket, under the base URL
    with pytest.raises(urllib.error.HTTPError) as err:
        _ranks_api(lab, token=False)
    assert err.value.code == 403
    set_id = _ranks_api(lab)[0]["id"]
    import asyncio
    import concurrent.futures

    from tornado import httpclient, websocket

    async def bare():  # a websocket with neither token nor cookie
        await websocket.websocket_connect(
            httpclient.HTTPRequest(
                f"ws://127.0.0.1:{lab.port}{BASE}workbench/ranksets/{set_id}/events", request_timeout=20
            )
        )

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright holds this thread's event loop
        with pytest.raises(httpclient.HTTPClientError) as err:
            pool.submit(asyncio.run, bare()).result(30)
    assert err.value.code == 403

    # status bar item of this notebook
    page.locator(".wb-StatusItem", has_text="2 ranks").wait_for(timeout=10_000)

    # a live pane keeps growing while the kernel sleeps in a cell
    run_cell(page, "%distrain train start")
    wait_kernel_idle(page, timeout=180_000)
    page.locator(".wb-RankSet[data-state='running'] button[data-action='pane']").click()
    pane = page.locator(".wb-Pane")
    pane.wait_for(timeout=15_000)
    run_cell(page, "time.sleep(15)")
    page.get_by_text(re.compile(r"^Python 3 \(ipykernel\) \| Busy$")).first.wait_for(timeout=10_000)
    page.wait_for_function("() => Number(document.querySelector('.wb-Pane')?.dataset.points || 0) > 0", timeout=30_000)
    first = int(pane.get_attribute("data-points"))
    time.sleep(4)
    second = int(pane.get_attribute("data-points"))
    assert "SLEPT" not in _output(page, "time.sleep(15)")  # still inside the long cell
    assert second > first, f"the pane's points did not grow during the cell: {first} -> {second}"
    shot(page, "lab_ranks_sidebar")  # the sidebar and a live pane while training (docs/images/sidebar.png)
    page.locator(".wb-StatusItem", has_text=re.compile(r"2 ranks · step \d+ · loss \d")).wait_for(timeout=10_000)
    _wait_output(page, "time.sleep(15)", "SLEPT", timeout=60)

    # the trainer paused, resumed and stopped from the sidebar
    _confirm(page, "trainer-pause")
    page.wait_for_function(
        """() => [...document.querySelectorAll('.wb-RankSet .wb-RankRow')]
        .filter(r => r.dataset.state === 'paused').length === 2""",
        timeout=15_000,
    )
    _confirm(page, "trainer-resume")
    page.wait_for_function(
        """() => [...document.querySelectorAll('.wb-RankSet .wb-RankRow td.wb-state')]
        .filter(td => td.textContent.endsWith('· running')).length === 2""",
        timeout=15_000,
    )
    _confirm(page, "trainer-stop")
    page.wait_for_function(
        """() => [...document.querySelectorAll('.wb-RankSet .wb-RankRow td.wb-state')]
        .filter(td => td.textContent.endsWith('· stopped')).length === 2""",
        timeout=15_000,
    )

    # interrupt from the sidebar stops a `while True` cell on the ranks
    run_cell(page, "while True:")
    page.get_by_text(re.compile(r"^Python 3 \(ipykernel\) \| Busy$")).first.wait_for(timeout=10_000)
    time.sleep(1.5)
    _confirm(page, "interrupt")
    wait_kernel_idle(page, timeout=30_000)
    assert "KeyboardInterrupt" in _output(page, "while True:")

    # a rank killed with SIGKILL shows dead, with its exit, within 2 s
    os.kill(pids[1], signal.SIGKILL)
    t0 = time.monotonic()
    page.locator(".wb-RankRow[data-rank='1'][data-state='dead']", has_text="killed by SIGKILL").wait_for(timeout=2_000)
    assert time.monotonic() - t0 <= 2.5

    # stop from the sidebar ends the ranks; the notebook's next `status` says so
    _confirm(page, "stop")
    deadline = time.monotonic() + 10
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(pids) == []
    page.locator(".wb-RankSet[data-state='stopped']").wait_for(timeout=5_000)
    run_cell(page, "%distrain status")
    _wait_output(page, "%distrain status", "stopped from the JupyterLab ranks sidebar", timeout=30)
    assert page.js_errors == [], page.js_errors


def test_sidebar_shows_a_queued_slurm_set_with_its_job_and_reason(lab_page, lab_base, monkeypatch):
    # A pending Slurm job is driven for real in tests/cluster/test_slurm.py (its registry entry
    # checked there); here the entry is written directly, as the kernel writes it while it waits.
    from workbench.notebook import registry
    from workbench.notebook.cluster import RankSet, RankSetConfig
    from workbench.notebook.cluster.slurm import JobState

    page, lab = lab_page, lab_base
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(HERE / "runtime"))  # the Lab server's registry
    rs = RankSet(RankSetConfig(n=2, launcher="slurm", backend="gloo"))
    rs.job_id = "7301"
    entry_id = registry.queued(rs, JobState("7301", "PENDING", "Resources", ()))
    try:
        page.goto(f"{lab.base}/lab/workspaces/queued?reset&token={lab.token}")
        page.locator(".lm-TabBar-tab[data-id='workbench-ranks']").click()
        box = page.locator(f".wb-RankSet[data-rankset-id='{entry_id}']")
        box.and_(page.locator("[data-state='queued']")).wait_for(timeout=15_000)
        meta = box.locator(".wb-RankSet-meta").inner_text()
        assert meta == "2 ranks · slurm · gloo · queued: Slurm job 7301 PENDING (Resources)", meta
        rows = box.locator(".wb-RankRow")
        assert rows.count() == 2
        assert [rows.nth(i).get_attribute("data-state") for i in range(2)] == ["queued", "queued"]
        assert [rows.nth(i).get_attribute("data-pid") for i in range(2)] == ["", ""]
        assert box.locator("button[data-action]").count() == 0  # nothing to act on yet, and not forgettable
        # the allocation is granted: starting on its node, until the started entry replaces it
        registry.queued(rs, JobState("7301", "RUNNING", "None", ("node3",)))
        box.and_(page.locator("[data-state='starting']")).wait_for(timeout=5_000)
        assert box.locator(".wb-RankSet-meta").inner_text().endswith("starting: Slurm job 7301 RUNNING on node3")
        registry.withdraw(rs)  # the start failed or was cancelled: gone from the sidebar
        box.wait_for(state="detached", timeout=5_000)
        assert page.js_errors == [], page.js_errors
    finally:
        registry.withdraw(rs)


DETACHED = """
import json, sys
sys.path.insert(0, {root!r})
import workbench
rs = workbench.start(2, backend="gloo", threads=1, name="overnight")
workbench.train.setup("ddp", model="tiny")
workbench.train.start(100000)
entry = workbench.detach("overnight")
print("SET " + json.dumps({{"pids": sorted(rs.started_pids), "keeper": entry["supervisor_pid"], "id": entry["id"]}}), flush=True)
"""  # then exits: the set lives on under its keeper (tests/ranks/test_detach.py)


def test_sidebar_shows_a_detached_set_and_its_stop_ends_the_keeper_too(lab_page, lab_base):
    import subprocess
    import sys

    page, lab = lab_page, lab_base
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(HERE / "runtime")}  # the Lab server's registry
    proc = subprocess.run(
        [sys.executable, "-c", DETACHED.format(root=str(ROOT))], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout.split("SET ", 1)[1].splitlines()[0])
    held = [*info["pids"], info["keeper"]]
    try:
        page.goto(f"{lab.base}/lab/workspaces/detached?reset&token={lab.token}")
        page.locator(".lm-TabBar-tab[data-id='workbench-ranks']").click()
        box = page.locator(f".wb-RankSet[data-rankset-id='{info['id']}']")
        box.and_(page.locator("[data-detached='true'][data-state='running']")).wait_for(timeout=15_000)
        assert box.locator(".wb-RankSet-title").evaluate("n => n.firstChild.textContent") == "overnight"
        assert box.locator(".wb-Badge-detached").inner_text() == "detached"
        assert (
            box.locator(".wb-Badge-detached")
            .get_attribute("title")
            .startswith(f"held by keeper pid {info['keeper']}: %distrain attach overnight")
        )
        # the trainer keeps reporting to the keeper, and the server's copy of its stream
        page.locator(".wb-RankSet[data-detached='true'] .wb-RankSet-meta", has_text=re.compile(r"step \d+")).wait_for(
            timeout=30_000
        )
        box.locator("button[data-action='stop']").click()
        page.locator(".jp-Dialog .jp-mod-accept").click()
        deadline = time.monotonic() + 15
        while _alive(held) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(held) == [], f"left after a stop from the sidebar: {_alive(held)}"
        box.wait_for(state="detached", timeout=10_000)  # the keeper removed its entry
        assert page.js_errors == [], page.js_errors
    finally:
        for pid in _alive(held):
            os.kill(pid, signal.SIGKILL)
