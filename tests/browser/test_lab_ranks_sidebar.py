"""The workbench's JupyterLab extension in a real JupyterLab under a non-root base URL.

The extensions under test are the ones installed in the environment, as ``make lab`` serves
them (``make`` links this tree's build into the venv and installs the server extension's switch
there). One notebook drives a whole rank set's life: start, live pane during a long cell,
interrupt, SIGKILL, stop from the sidebar.
"""

from __future__ import annotations

import json
import math
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
GO = HERE / "go"  # lets the stuck rank of the Where drill go on
CELLS = [
    "%load_ext workbench\n%distrain start -n 2",
    "import json, workbench\nprint('PIDS', json.dumps([r['pid'] for r in workbench.status()]))",
    "%distrain train start --gpt tiny --steps 100000 --no-dashboard",
    "import time\ntime.sleep(15)\nprint('SLEPT')",
    "%%distrain\nimport time\nwhile True:\n    time.sleep(0.05)",
    "%%distrain\nimport os, time, torch, torch.distributed as dist\ndef wb_slow_loader():\n"
    f"    while not os.path.exists({str(GO)!r}):\n        time.sleep(0.05)\n"
    "if dist.get_rank() == 1:\n    wb_slow_loader()\ndist.all_reduce(torch.ones(2))\nprint('ENTERED')",
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
    # the session's run, as its kind tells it (the Lab registry entry's "run", notebook.runs)
    page.locator(
        ".wb-RankSet[data-state='running'] .wb-RankSet-run", has_text=re.compile(r"^trainer run run-")
    ).wait_for(timeout=15_000)
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

    # Where leads with the rank the others wait for, from the ranks' flight records
    run_cell(page, "def wb_slow_loader")
    page.get_by_text(re.compile(r"^Python 3 \(ipykernel\) \| Busy$")).first.wait_for(timeout=10_000)
    time.sleep(1.5)
    _confirm(page, "where")
    lead = page.locator(".jp-Dialog .wb-Culprit")
    lead.wait_for(timeout=15_000)
    assert re.fullmatch(
        r"rank 0 waits in all_reduce #\d+ \(group world\) for \d+\.\d s; "
        r"rank 1 never entered it: it is in wb_slow_loader \(line 4 of a cell\)",
        lead.inner_text().strip(),
    ), lead.inner_text()
    assert "[rank 1]" in page.locator(".jp-Dialog .wb-Stacks").inner_text()  # the stacks below it
    shot(page, "lab_where_culprit")
    page.locator(".jp-Dialog .jp-mod-accept").click()
    GO.touch()
    _wait_output(page, "def wb_slow_loader", r"\[rank 1\] ENTERED", timeout=30)
    wait_kernel_idle(page, timeout=30_000)

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


def test_sidebar_groups_1024_simulated_ranks_by_host_and_state(lab_page, lab_base, monkeypatch, tmp_path):
    # A SIMULATION (tests/sim_ranks.py): 1024 ranks on 16 simulated hosts of 64, in a registry
    # entry written as a kernel writes it (registry.entry_for); no rank process runs, so the
    # server lists them as ranks on other hosts ("remote": ok). Their deaths are reported through
    # the call the kernel's watcher makes; their step events go through a real collector and its
    # mirror to the server's stream reader. The sidebar polls the server every second.
    from sim_ranks import SimulatedPublishers, SimulatedRankSet

    from workbench.notebook.stream import Collector

    page, lab = lab_page, lab_base
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(HERE / "runtime"))  # the Lab server's registry
    collector = Collector()
    pubs = SimulatedPublishers(collector, 1024)
    sim = SimulatedRankSet(1024, str(tmp_path))
    entry_id = sim.announce(collector)
    bounded = 14 + 2 * 4  # an open group's rows in the DOM: its view (14) and 4 beyond each edge
    try:
        listed = next(s for s in _ranks_api(lab) if s["id"] == entry_id)
        assert len(listed["ranks"]) == 1024 and listed["state"] == "running"
        page.goto(f"{lab.base}/lab/workspaces/scale?reset&token={lab.token}")
        page.locator(".lm-TabBar-tab[data-id='workbench-ranks']").click()
        box = page.locator(f".wb-RankSet[data-rankset-id='{entry_id}']")
        box.wait_for(timeout=15_000)
        assert box.locator(".wb-RankSet-counts").inner_text() == "1024 ranks on 16 hosts: 1024 ok"
        heads = box.locator(".wb-RankGroup-head")
        assert heads.count() == 16
        assert heads.first.get_attribute("data-summary") == "host sim-host-00: 64 ranks, 64 ok"
        assert heads.first.inner_text() == "▸ host sim-host-00: 64 ranks, 64 ok"
        assert box.locator(".wb-RankRow").count() == 0  # closed groups hold no rows

        # expanding a group lists its ranks, only those in view in the DOM
        group = box.locator(".wb-RankGroup[data-host='sim-host-03']")
        group.locator(".wb-RankGroup-toggle").click()
        rows = group.locator(".wb-RankRow")
        rows.first.wait_for(timeout=5_000)
        shown = [int(r) for r in rows.evaluate_all("rows => rows.map(r => r.dataset.rank)")]
        assert shown[:2] == [192, 193] and 14 <= len(shown) <= bounded, shown
        assert rows.first.locator(".wb-state").inner_text() == "remote"
        # scrolled to its end: the last rank is drawn, and still no more rows than the bound
        group.locator(".wb-RankRows").evaluate("n => { n.scrollTop = n.scrollHeight; }")
        last = group.locator(".wb-RankRow[data-rank='255']")
        last.wait_for(timeout=5_000)
        assert rows.count() <= bounded
        time.sleep(2.5)  # two of the sidebar's redraws: the group stays open and scrolled
        assert last.is_visible() and group.get_attribute("data-open") == "true"
        # every group open: 1024 ranks, a bounded number of row elements in the whole page
        for i in range(16):
            toggle = box.locator(".wb-RankGroup").nth(i).locator(".wb-RankGroup-toggle")
            if toggle.inner_text().startswith("▸"):
                toggle.click()
        page.wait_for_function(
            f"() => document.querySelectorAll(\".wb-RankSet[data-rankset-id='{entry_id}'] "
            ".wb-RankGroup[data-open='true']\").length === 16",
            timeout=5_000,
        )
        in_dom = page.locator(".wb-RankRow").count()
        assert 16 * 14 <= in_dom <= 16 * bounded, in_dom

        # a rank dying shows within 2 s: its host's counts, the set's counts
        t0 = time.monotonic()
        sim.kill(700)  # on sim-host-10 (ranks 640-703)
        dead_host = box.locator(".wb-RankGroup[data-host='sim-host-10']")
        dead_host.locator(".wb-RankGroup-head[data-summary='host sim-host-10: 64 ranks, 63 ok, 1 dead']").wait_for(
            timeout=2_000
        )
        assert time.monotonic() - t0 <= 2.5
        assert box.locator(".wb-RankSet-counts").inner_text() == "1024 ranks on 16 hosts: 1023 ok, 1 dead"
        # its "1 dead" lists that rank alone, with its exit
        dead_host.locator("button[data-state-filter='dead']").click()
        dead_host.locator(".wb-RankRow[data-rank='700'][data-state='dead']").wait_for(timeout=5_000)
        assert dead_host.locator(".wb-RankRow").count() == 1
        assert "killed by SIGKILL" in dead_host.locator(".wb-RankRow").inner_text()
        # closing the other groups takes their rows out of the page
        for i in range(16):
            if i != 10:
                box.locator(".wb-RankGroup").nth(i).locator(".wb-RankGroup-toggle").click()
        page.wait_for_function("() => document.querySelectorAll('.wb-RankRow').length === 1", timeout=5_000)

        # steps stream in; rank 300 stops at step 2 while the others go on to step 5: a straggler
        pubs.steps(3)
        time.sleep(1.2)  # the server marks a rank 2 steps and 1 s (rank clocks) behind
        pubs.steps(3, skip={300})
        # (while the burst of steps is on its way, ranks not yet past step 2 count as lagging too)
        counts = "1024 ranks on 16 hosts: 1023 ok, 1 dead; 1 straggling"
        box.locator(".wb-RankSet-counts", has_text=re.compile(f"^{re.escape(counts)}$")).wait_for(timeout=10_000)
        lagging = box.locator(".wb-RankGroup[data-host='sim-host-04']")
        assert lagging.locator(".wb-RankGroup-head").get_attribute("data-summary") == (
            "host sim-host-04: 64 ranks, 64 ok; 1 straggling"
        )
        # its rows show each rank's step and loss (rank 256: step 5, the loss the simulator sent)
        lagging.locator(".wb-RankGroup-toggle").click()
        cells = lagging.locator(".wb-RankRow[data-rank='256'] span")
        cells.first.wait_for(timeout=5_000)
        expected, deadline = ["5", f"{4.0 * math.exp(-5 / 300):.4g}"], time.monotonic() + 10
        while (seen := [cells.nth(i).inner_text() for i in (5, 6)]) != expected and time.monotonic() < deadline:
            time.sleep(0.2)  # the last steps may still be on their way through the stream
        assert seen == expected
        lagging.locator("button[data-state-filter='straggling']").click()
        row = lagging.locator(".wb-RankRow[data-rank='300']")
        row.wait_for(timeout=5_000)
        assert lagging.locator(".wb-RankRow").count() == 1
        assert row.locator(".wb-straggler").inner_text() == "2 ⚠"
        page.locator(".wb-Ranks").evaluate("n => { n.scrollTop = 0; }")
        shot(page, "lab_ranks_sidebar_1024")  # docs/images/sidebar-1024.png
        assert page.js_errors == [], page.js_errors
    finally:
        sim.withdraw()
        pubs.close()
        collector.close()


DETACHED = """
import json, sys
sys.path.insert(0, {root!r})
import workbench
rs = workbench.start(2, backend="gloo", threads=1, session="overnight")
workbench.train.setup("ddp", model="tiny")
workbench.train.start(100000)
entry = workbench.detach("overnight")
print("SET " + json.dumps({{"pids": sorted(rs.started_pids), "keeper": entry["keeper_pid"], "id": entry["id"]}}), flush=True)
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
            .startswith(f"held by keeper pid {info['keeper']}: %distrain attach --session overnight")
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
