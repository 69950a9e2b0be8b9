"""A real two-node Ray cluster for the tests: a head on this host, a worker node on the second host.

The head binds this host's address toward the network namespace (so the worker node and
the ranks there reach it); the worker node runs inside the namespace with its own host
name. Both are ``ray start --block`` processes started here in sessions of their own, and
are ended by their pids: SIGTERM to ``ray start``, which ends the daemons it started,
then SIGKILL to whatever is left in its session (``ray stop`` would kill by name, every
Ray on the machine). Ports are free ones asked of the kernel, so two suites can run at once.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil

from .daemons import SecondHost, _spawn, free_port

# ``ray start`` made patient for a machine loaded by other suites, where a node's Python
# agents alone took longer to start than Ray allows (fixed in its code): the raylet waits
# 15 s for the agents' port files, and ``ray start`` 30 s for the raylet to register. The
# agents' ports are given on the command line (``_ports``), so their files are written
# before the raylet starts (each agent writes the same port again once up); and the
# registration is waited for up to 180 s.
PATIENT_RAY = """
import sys, time
import ray._private.node as node
import ray._private.services as services
from ray import _raylet

first_get_node = services.get_node
def patient_get_node(*args, **kwargs):
    deadline = time.monotonic() + 180
    while True:
        try:
            return first_get_node(*args, **kwargs)
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
services.get_node = patient_get_node

first_start_raylet = node.Node.start_raylet
def start_raylet(self, *args, **kwargs):
    p = self._ray_params
    for name, port in (
        (_raylet.DASHBOARD_AGENT_LISTEN_PORT_NAME, p.dashboard_agent_listen_port),
        (_raylet.METRICS_AGENT_PORT_NAME, p.metrics_agent_port),
        (_raylet.METRICS_EXPORT_PORT_NAME, p.metrics_export_port),
        (_raylet.RUNTIME_ENV_AGENT_PORT_NAME, p.runtime_env_agent_port),
    ):
        if port:
            _raylet.persist_port(self._session_dir, self._node_id, name, int(port))
    return first_start_raylet(self, *args, **kwargs)
node.Node.start_raylet = start_raylet

from ray.scripts.scripts import main
sys.argv[0] = "ray"
main()
"""
RAY = [sys.executable, "-c", PATIENT_RAY]
RAY_ENV = {"RAY_agent_register_timeout_ms": "180000"}  # the agents' registration with the raylet
HEAD_PORT_FLAGS = ("--ray-client-server-port", "--dashboard-port")
PORT_FLAGS = (
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
    "--node-manager-port",
    "--object-manager-port",
)


def _ports(head: bool = True) -> list[str]:
    out = []
    for flag in (HEAD_PORT_FLAGS if head else ()) + PORT_FLAGS:
        out += [flag, str(free_port())]
    return out


def session_pids(leader: int) -> list[int]:
    """Live processes in the session ``leader`` leads (the daemons ``ray start`` started)."""
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getsid(p.pid) == leader and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (OSError, psutil.Error):
            continue
    return out


class RayNodes:
    """``ray start --head`` here and ``ray start --address`` inside ``host``'s namespace."""

    ATTEMPTS = 2  # a node start that fails anyway (its raylet never registers) is tried once more

    def __init__(self, host: SecondHost, *, cpus: int = 2, worker_python: str | None = None, join: bool = False):
        """``worker_python``: the worker node's own Python (a host whose folders hide this one's venv);
        ``join``: the worker node in the host's running namespaces (its sshd's disk), not new ones."""
        self.host = host
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="wb-ray-"))
        self.port = free_port()
        self.address = f"{host.addr_here}:{self.port}"
        self.procs: list[subprocess.Popen] = []
        common = ["--block", "--num-cpus", str(cpus), "--disable-usage-stats"]
        try:
            head = [*RAY, "start", "--head", "--port", str(self.port), "--node-ip-address", host.addr_here]
            head += ["--temp-dir", str(self.dir / "tmp"), "--include-dashboard=false", *common, *_ports()]
            self._start(head, self.dir / "head.out")
            ray = [worker_python, *RAY[1:]] if worker_python else RAY
            worker = [*ray, "start", "--address", self.address, "--node-ip-address", host.addr, *common]
            worker += _ports(head=False)
            inside = host.join if join else (lambda cmd: host.enter(f"exec {shlex.join(cmd)}"))
            self._start(worker, self.dir / "worker.out", inside)
        except BaseException:
            self.close()
            raise

    def _start(self, cmd: list[str], log: pathlib.Path, wrap=lambda cmd: cmd) -> None:
        for attempt in range(self.ATTEMPTS):
            proc = _spawn(wrap(cmd), log, env={**os.environ, **RAY_ENV})
            if self._started(proc, log):
                self.procs.append(proc)
                return
            self._end([proc])
            if attempt == self.ATTEMPTS - 1:
                raise RuntimeError(
                    f"Ray node did not start: {' '.join(cmd)}\n" + log.read_text(errors="replace")[-3000:]
                )

    @staticmethod
    def _started(proc: subprocess.Popen, log: pathlib.Path, timeout: float = 180.0) -> bool:
        """``ray start --block`` says so once its node has registered; it exits if it could not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if "Ray runtime started" in log.read_text(errors="replace"):
                return True
            time.sleep(0.2)
        return False

    def pids(self) -> list[int]:
        """Every live process of the two nodes (their daemons and workers), by session."""
        return sorted({pid for p in self.procs for pid in session_pids(p.pid)})

    def _end(self, procs: list[subprocess.Popen]) -> list[int]:
        """SIGTERM to each ``ray start``, then SIGKILL what is left in its session; the killed pids."""
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        killed = []
        for pid in sorted({pid for p in procs for pid in session_pids(p.pid)}):
            try:
                psutil.Process(pid).kill()
                killed.append(pid)
            except psutil.Error:
                pass
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        return killed

    def close(self) -> list[int]:
        """End both nodes by pid; returns the pids that had to be killed after the grace."""
        killed = self._end(self.procs)
        shutil.rmtree(self.dir, ignore_errors=True)
        return killed
