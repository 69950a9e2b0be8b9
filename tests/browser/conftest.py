"""JupyterLab in headless Chromium: a Lab server per session, a fresh browser per test.

* ``lab``: ``jupyter lab`` on a free port, rooted at the repository, with every
  Jupyter / IPython state folder under ``.state/browser`` and user settings that keep
  the tests deterministic (no autosave, so a run never writes outputs into a tracked
  notebook; no news / update pop-ups; no cell windowing, so every output is in the DOM).
  It is stopped by its process group afterwards, and anything it left behind (kernels,
  their rank processes) is ended by pid.
* ``page``: a Playwright page in Debian's ``/usr/bin/chromium`` (never a downloaded
  browser) with a fresh user-data-dir under ``.state/browser``; the browsers of a session
  share one disk cache (emptied when the session starts), so that Lab's scripts are fetched
  and compiled once, not once per test.
* The workbench's Lab and server extensions are the ones installed in this environment
  (``make`` installs both into the venv, as ``make lab`` uses them): no server here links or
  enables them itself, and a missing install fails the tests that need it, naming the fix.
* Screenshots go to ``test-artifacts/``; a failing test leaves ``FAILED-<test>.png``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import psutil
import pytest

from .helpers import ARTIFACTS, ROOT, STATE, shot

CHROMIUM = pathlib.Path("/usr/bin/chromium")
CACHE = STATE / "chromium-cache"  # the session's browsers' HTTP and compiled-script cache
LABEXT = "distrain-workbench-lab"  # the Lab extension's name (extensions/package.json)
SERVER_EXT = "workbench.labserver"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# user settings: plugin id -> settings
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
    "@jupyterlab/apputils-extension:notification": {"checkForUpdates": False, "fetchNews": "false"},
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}


def pytest_collection_modifyitems(items):
    for item in items:
        if pathlib.Path(str(item.fspath)).is_relative_to(pathlib.Path(__file__).parent):
            item.add_marker(pytest.mark.browser)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        item.stash[_FAILED] = report.failed
    return report


_FAILED = pytest.StashKey[bool]()


def _need_browser() -> None:
    if not CHROMIUM.exists():
        pytest.skip(
            "/usr/bin/chromium is missing: install Debian's chromium (apt-get install chromium) "
            "to run the JupyterLab browser tests"
        )
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.skip("the playwright Python package is not installed (pip install -e '.[test]')")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_settings(folder: pathlib.Path) -> None:
    for plugin, values in LAB_SETTINGS.items():
        package, name = plugin.split(":")
        path = folder / package / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


class Lab:
    def __init__(self, proc: subprocess.Popen, port: int, token: str, log: pathlib.Path):
        self.proc, self.port, self.token, self.log = proc, port, token, log
        self.base = f"http://127.0.0.1:{port}"
        self.seen: dict[int, psutil.Process] = {}  # every descendant ever seen (kernels, ranks)

    def remember(self) -> None:
        """Note the server's descendants now, so they can be ended by pid if left behind."""
        try:
            self.seen.update({p.pid: p for p in psutil.Process(self.proc.pid).children(recursive=True)})
        except psutil.NoSuchProcess:
            pass

    def leftovers(self) -> list[psutil.Process]:
        out = []
        for p in self.seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.NoSuchProcess:
                pass
        return out

    def url(self, path: str, workspace: str | None = None) -> str:
        """The Lab URL that opens ``path`` (relative to the repository) in a fresh workspace."""
        ws = workspace or uuid.uuid4().hex[:8]
        return f"{self.base}/lab/workspaces/{ws}/tree/{path}?reset&token={self.token}"

    def api(self, method: str, path: str):
        req = urllib.request.Request(
            f"{self.base}/api/{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def rest(self, path: str, token: bool = True):
        """GET ``path`` under the server's base URL (a server extension's route), as JSON."""
        headers = {"Authorization": f"token {self.token}"} if token else {}
        req = urllib.request.Request(f"{self.base}/{path}", headers=headers)
        with urllib.request.urlopen(req, timeout=20) as resp:
            return json.loads(resp.read())

    def kernels(self, timeout: float = 10) -> list[dict]:
        """The server's kernels. Jupyter Server lists a kernel the moment it has started but
        gives it ``last_activity`` one step later, and a listing in between answers 500: that
        answer is asked again, any other error is raised."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.api("GET", "kernels")
            except urllib.error.HTTPError as e:
                if e.code != 500 or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def shutdown_kernels(self) -> None:
        """Shut every kernel down (each stops its ranks at exit); wait until they are gone."""
        for kernel in self.kernels():
            try:
                self.api("DELETE", f"kernels/{kernel['id']}")
            except Exception:
                pass

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def state_env(root: pathlib.Path, jupyter: str = "") -> dict:
    """This process's environment with every Jupyter / IPython state folder under ``root``
    (Jupyter's under ``root / jupyter``), one thread per op, and no JupyterLab settings
    folder from outside."""
    env = dict(os.environ)
    for var, sub in (
        ("IPYTHONDIR", "ipython"),
        ("JUPYTER_RUNTIME_DIR", f"{jupyter}runtime"),
        ("JUPYTER_CONFIG_DIR", f"{jupyter}config"),
        ("JUPYTER_DATA_DIR", f"{jupyter}data"),
        ("MPLCONFIGDIR", "mpl"),
    ):
        env[var] = str(root / sub)
        (root / sub).mkdir(parents=True, exist_ok=True)
    env["OMP_NUM_THREADS"] = "1"
    env.pop("JUPYTERLAB_SETTINGS_DIR", None)
    return env


def installed_problem() -> str | None:
    """What is missing from this environment's install of the workbench's extensions, or None.

    Only the folders every test server shares count (the venv's, the system's): each server
    has JUPYTER_CONFIG_DIR / JUPYTER_DATA_DIR of its own, so an install there would not be seen.
    """
    from jupyter_core.paths import jupyter_config_dir, jupyter_config_path, jupyter_data_dir, jupyter_path
    from jupyter_server.extension.config import ExtensionConfigManager

    data = [d for d in jupyter_path("labextensions") if d != os.path.join(jupyter_data_dir(), "labextensions")]
    config = [d for d in jupyter_config_path() if d != jupyter_config_dir()]
    missing = []
    if not any((pathlib.Path(d) / LABEXT / "package.json").exists() for d in data):
        missing.append(f"the Lab extension {LABEXT} (searched {', '.join(data)})")
    if not ExtensionConfigManager(read_config_path=config).get_jpserver_extensions().get(SERVER_EXT):
        missing.append(f"the server extension {SERVER_EXT} (searched {', '.join(config)})")
    if not missing:
        return None
    return (
        f"not installed in {sys.prefix}: {'; '.join(missing)}. `make .venv/bin/.installed` (run by make "
        "lab/demo/test) installs both; by hand: `pip install -e .` then `jupyter labextension develop --overwrite .`"
    )


def need_installed() -> None:
    problem = installed_problem()
    if problem:
        pytest.fail(problem)


def installed_env(here: pathlib.Path) -> dict:
    """:func:`state_env` under a fresh ``here`` with the test settings in ``here / "settings"``;
    the extensions are the installed ones (:func:`need_installed`)."""
    need_installed()
    shutil.rmtree(here, ignore_errors=True)
    env = state_env(here)
    _write_settings(here / "settings")
    return env


def jupyter_cmd(app: str, port: int, token: str, *options: str) -> list[str]:
    """The command line of the Jupyter server ``app`` (``jupyterlab``, ``notebook``) on
    ``port``, rooted at the repository, with what every test server takes, then ``options``."""
    return [
        sys.executable,
        "-m",
        app,
        "--no-browser",
        f"--IdentityProvider.token={token}",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.root_dir={ROOT}",
        "--ContentsManager.allow_hidden=True",
        *options,
    ]


@pytest.fixture(scope="session")
def lab():
    _need_browser()
    need_installed()
    shutil.rmtree(STATE / "lab-workspaces", ignore_errors=True)
    env = state_env(STATE, jupyter="jupyter/")
    env["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"
    env.pop("JUPYTERLAB_WORKSPACES_DIR", None)
    settings = STATE / "lab-settings"
    shutil.rmtree(settings, ignore_errors=True)
    _write_settings(settings)
    port, token = _free_port(), secrets.token_hex(16)
    log = STATE / "jupyter-lab.log"
    cmd = jupyter_cmd(
        "jupyterlab",
        port,
        token,
        # checkpoints under .state, not as .ipynb_checkpoints/ beside tracked notebooks
        f"--FileCheckpoints.checkpoint_dir={STATE / 'checkpoints'}",
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={STATE / 'lab-workspaces'}",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    )
    with serve(cmd, env, port, token, log, "jupyter lab") as server:
        yield server


@contextlib.contextmanager
def serve(cmd: list[str], env: dict, port: int, token: str, log: pathlib.Path, name: str, base: str | None = None):
    """Run a Jupyter server command until it answers, yield it as a :class:`Lab`, then end
    it, its kernels and whatever they left behind, by pid."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd = [*cmd, "--allow-root"]  # containers and CI runners
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Lab(proc, port, token, log)
    if base is not None:
        server.base = base
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{server.log_tail()}")
            try:
                server.api("GET", "status")
                break
            except Exception:
                if time.monotonic() > deadline:
                    pytest.fail(f"{name} did not answer on port {port} in 90 s:\n{server.log_tail()}")
                time.sleep(0.5)
        yield server
    finally:
        server.remember()
        try:
            server.shutdown_kernels()
        except Exception:
            pass
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server's own group (start_new_session)
        except ProcessLookupError:
            pass
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        # kernels run in their own sessions: end by pid whatever the server left behind
        left = server.leftovers()
        for p in left:
            try:
                p.terminate()
            except psutil.NoSuchProcess:
                pass
        _, still = psutil.wait_procs(left, timeout=10)
        for p in still:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass


@pytest.fixture(scope="session")
def playwright_driver():
    _need_browser()
    from playwright.sync_api import sync_playwright

    shutil.rmtree(CACHE, ignore_errors=True)
    CACHE.mkdir(parents=True)
    pw = sync_playwright().start()
    yield pw
    pw.stop()


def open_browser(playwright_driver, profile: pathlib.Path, width: int):
    """``(context, page)``: Debian's Chromium on the user-data-dir ``profile``; the page's
    uncaught exceptions are collected, with their stack, in ``page.js_errors``."""
    context = playwright_driver.chromium.launch_persistent_context(
        str(profile),
        executable_path=str(CHROMIUM),
        headless=True,
        args=[*CHROMIUM_ARGS, f"--disk-cache-dir={CACHE}"],
        viewport={"width": width, "height": 1000},
        timezone_id="UTC",
    )
    context.set_default_timeout(30_000)
    pg = context.pages[0] if context.pages else context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(f"{exc}\n{exc.stack}" if exc.stack else str(exc)))
    pg.js_errors = errors
    return context, pg


@contextlib.contextmanager
def browsing(playwright_driver, server: Lab, profile: pathlib.Path, shot_name: str):
    """A page of :func:`open_browser` on ``server``; afterwards its screenshot ``shot_name``,
    and the server's kernels shut down (each stops its ranks)."""
    context, pg = open_browser(playwright_driver, profile, width=1500)
    try:
        yield pg
    finally:
        try:
            shot(pg, shot_name)
        except Exception:
            pass
        context.close()
        server.remember()
        server.shutdown_kernels()


@pytest.fixture
def page(request, lab, playwright_driver):
    """A page in a fresh Chromium profile; kernels are shut down after the test."""
    (ARTIFACTS / f"FAILED-{request.node.name}.png").unlink(missing_ok=True)
    profile = STATE / "chromium" / uuid.uuid4().hex[:8]
    profile.mkdir(parents=True)
    context, pg = open_browser(playwright_driver, profile, width=1400)
    console: list[str] = []
    pg.on("console", lambda msg: console.append(msg.text[:500]) if msg.type == "error" else None)
    pg.console_errors = console  # console.error lines (widget render failures land here)
    try:
        yield pg
    finally:
        if request.node.stash.get(_FAILED, False):
            try:
                shot(pg, f"FAILED-{request.node.name}")
            except Exception:
                pass
        context.close()
        shutil.rmtree(profile, ignore_errors=True)
        lab.remember()
        lab.shutdown_kernels()
        _wait_no_kernels(lab)


def _wait_no_kernels(lab: Lab, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if not lab.kernels():
                return
        except Exception:
            return
        time.sleep(0.5)
