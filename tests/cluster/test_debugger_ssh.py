"""JupyterLab's debugger on a rank set over two hosts: rank 0 here, rank 1 in the network
namespace's host over real ssh. The ranks' debug links reach the notebook the way their event
stream does; nothing listens on the second host for the debugger.

JupyterLab in Chromium with the installed extensions, as in tests/browser (its server and
browser helpers are reused here; this tier needs root for the second host)."""

from __future__ import annotations

import concurrent.futures
import secrets
import socket

import pytest
from browser.conftest import CACHE, _free_port, _need_browser, browsing, installed_env, jupyter_cmd, serve
from browser.debugger_steps import check_both_ranks_then_continue, notebook, run_to_the_breakpoint
from browser.helpers import STATE

pytestmark = pytest.mark.timeout(400)

HERE = STATE / "debugger-ssh"


@pytest.fixture(scope="module")
def lab_here():
    """JupyterLab with the installed extensions; its kernels start ranks over ssh."""
    _need_browser()
    env = installed_env(HERE)
    port, token = _free_port(), secrets.token_hex(16)
    cmd = jupyter_cmd(
        "jupyterlab",
        port,
        token,
        f"--FileCheckpoints.checkpoint_dir={HERE / 'checkpoints'}",
        f"--LabApp.user_settings_dir={HERE / 'settings'}",
        f"--LabApp.workspaces_dir={HERE / 'workspaces'}",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    )
    with serve(cmd, env, port, token, HERE / "jupyter-lab.log", "jupyter lab") as server:
        yield server


def test_debugger_stops_a_rank_on_the_other_host_at_a_gutter_breakpoint(second_host, lab_here):
    from playwright.sync_api import sync_playwright

    start = (
        "%load_ext workbench\n%distrain start -n 2 --backend gloo --threads 1 --launcher ssh "
        f"--hosts localhost:1,root@{second_host.addr}:1 --ssh-config {second_host.ssh_config}"
    )
    CACHE.mkdir(parents=True, exist_ok=True)

    def in_the_browser():
        with sync_playwright() as pw, browsing(pw, lab_here, HERE / "chromium", "lab_debugger_ssh_end") as page:
            run_to_the_breakpoint(page, lab_here, notebook("two_hosts.ipynb", start))
            hosts = [socket.gethostname(), second_host.hostname]
            check_both_ranks_then_continue(page, hosts=hosts, shot_name="lab_debugger_ssh")
            assert not page.js_errors, page.js_errors

    # a thread of its own: in a session that also runs tests/browser, this thread already
    # holds that tier's Playwright (and its event loop), and a second one cannot start here
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(in_the_browser).result()
