"""torchft's lighthouse as a process of the notebook side, started and ended by pid like the controller.

The lighthouse forms the quorum of replica groups every step (torchft). It is torchft's own
binary (``torchft_lighthouse``, installed beside Python by the ``ft`` extra), so the notebook
never imports torch or torchft. Its log (a line per quorum) goes to a file, not the notebook.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from . import health, network

NOT_INSTALLED = (
    "torchft is not installed in this environment: `pip install 'distrain-workbench[ft]'` "
    "(with torch pinned: `pip install torchft -c <(pip freeze | grep ^torch==)`)"
)


def binary() -> str | None:
    """The lighthouse executable beside this Python, else on PATH; None without torchft."""
    if importlib.util.find_spec("torchft") is None:
        return None
    here = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    return here if os.access(here, os.X_OK) else shutil.which("torchft_lighthouse")


_PR_SET_PDEATHSIG = 1
_spawner: ThreadPoolExecutor | None = None


def _end_with_parent() -> None:
    """In the child before exec: SIGTERM when the notebook process is gone (a killed kernel leaves
    no lighthouse behind; the controller watches its parent the same way)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux
        pass


def _spawn(cmd: list[str], log) -> subprocess.Popen:
    """Start the lighthouse from one thread that lives as long as this process: PDEATHSIG fires when
    the thread that forked the child ends, not the process."""
    global _spawner
    if _spawner is None:
        _spawner = ThreadPoolExecutor(1, thread_name_prefix="workbench-lighthouse-spawner")
    return _spawner.submit(
        subprocess.Popen,
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_end_with_parent,
    ).result()


class Lighthouse:
    """One lighthouse on this host (``127.0.0.1``); ``address`` is what torchft's Manager takes.

    ``quorum_timeout_s``: how long the survivors wait for a replica that went silent before
    they form a quorum without it (the lighthouse's heartbeat and join timeouts).
    """

    def __init__(self, *, min_replicas: int = 1, quorum_timeout_s: float = 10.0, log_path: str | None = None):
        exe = binary()
        if exe is None:
            raise RuntimeError(NOT_INSTALLED)
        self.quorum_timeout_s = quorum_timeout_s
        self.log_path = log_path
        if log_path:
            os.makedirs(os.path.dirname(log_path), exist_ok=True)
        self._log = open(log_path or os.devnull, "ab")
        ms = str(max(100, int(quorum_timeout_s * 1000)))
        for _attempt in range(3):  # a free port may be taken by another process before the lighthouse binds it
            self.port = network.free_port()
            self.address = f"http://127.0.0.1:{self.port}"
            cmd = [exe, "--bind", f"127.0.0.1:{self.port}", "--min_replicas", str(min_replicas)]
            cmd += ["--join_timeout_ms", ms, "--heartbeat_timeout_ms", ms, "--quorum_tick_ms", "50"]
            self.proc = _spawn(cmd, self._log)
            self.pid = self.proc.pid
            try:
                if self._wait_listening(30.0):
                    return
            except BaseException:
                self.stop()
                raise
        self.stop()
        raise RuntimeError(f"the torchft lighthouse could not bind a port in 3 tries: {self.log()}")

    def _wait_listening(self, limit: float) -> bool:
        """True once this process listens on its port; False if it ended (the port was taken)."""
        deadline = time.monotonic() + limit
        me = psutil.Process(self.pid)
        while True:
            if self.proc.poll() is not None:
                return False
            try:
                if any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in me.net_connections("tcp")):
                    return True
            except psutil.Error:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the torchft lighthouse did not listen on port {self.port} within {limit} s")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self, limit: int = 2000) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            return f.read()[-limit:]

    def stop(self) -> list[int]:
        """End it by pid; returns the pids still alive (none when all went well)."""
        left = health.end_pids([self.pid], grace=1.0) if self.proc.poll() is None else []
        self.proc.poll()
        self._log.close()
        return left
