"""Ranks on several hosts over SSH: ``--hosts hostA:2,hostB:2``.

Hosts that name this machine (``localhost``, its host name or one of its addresses) get
local engines; every other host gets ipyparallel's SSH engine launcher, one engine set
per host, each engine wrapped by the rank guard (``workbench.engine.guard``) so that its
death is reported with host and exit status and it ends when the notebook is gone.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from dataclasses import dataclass

from ...shared.wire import ENV_HOST_SLOT
from . import network

_HOST = re.compile(r"^(?:[A-Za-z0-9_.-]+@)?[A-Za-z0-9_.-]+$")


@dataclass(frozen=True)
class HostSlot:
    host: str  # as given: [user@]name
    n: int
    local: bool


def parse_hosts(text: str) -> tuple[HostSlot, ...]:
    """``a:2,b:2`` -> slots; a clear error naming the bad entry otherwise."""
    slots = []
    for item in (text or "").split(","):
        item = item.strip()
        host, sep, count = item.rpartition(":")
        if not sep or not host or not count.isdigit() or int(count) < 1 or not _HOST.match(host):
            raise ValueError(f"--hosts entry {item!r} is not HOST:N (e.g. --hosts node1:4,root@node2:4)")
        slots.append(HostSlot(host, int(count), is_this_host(host)))
    names = [s.host for s in slots]
    if len(set(names)) != len(names):
        raise ValueError(f"--hosts names a host twice ({text}): give each host once with its count")
    return tuple(slots)


def is_this_host(host: str) -> bool:
    name = host.split("@", 1)[-1]
    if name in ("localhost", "127.0.0.1", socket.gethostname(), socket.gethostname().split(".")[0]):
        return True
    return name in network.local_addresses()


def guard_cmd(python: str) -> list[str]:
    """Run the guard from the installed package without importing the package itself first."""
    code = (
        "import importlib.util,os,runpy,sys;"
        "p=importlib.util.find_spec('workbench').submodule_search_locations[0];"
        "sys.argv[0]=os.path.join(p,'engine','guard.py');"
        "runpy.run_path(sys.argv[0],run_name='__main__')"
    )
    return [python, "-c", code]


def engine_cmd(python: str) -> list[str]:
    return guard_cmd(python) + ["--", python, "-m", "ipyparallel.engine"]


# ipyparallel keeps one ``ssh host python`` open per remote engine (it waits on the pid for
# 60 s, then again): on a link that went down such a session would hang for the ~15 minutes
# TCP retransmits. These end it (and a connect to a host that is gone) within seconds;
# options on the command line win over the user's ssh_config.
LINK_OPTIONS = ("-o", "ConnectTimeout=10", "-o", "ServerAliveInterval=2", "-o", "ServerAliveCountMax=3")


def ssh_options(ssh_config: str | None) -> list[str]:
    return [*LINK_OPTIONS, *(["-F", ssh_config] if ssh_config else [])]


def engine_set_launcher():
    """ipyparallel's SSH engine set, whose pid polls give up quietly on a host that is gone.

    Its poll thread dies with a traceback when ssh fails; here a failed poll counts as "still
    running": whether a host is gone is the lifeline's call (its beats), which then stops the
    polls (:func:`forget_host`)."""
    import subprocess

    from ipyparallel.cluster.launcher import SSHEngineLauncher, SSHEngineSetLauncher

    class PatientSSHEngine(SSHEngineLauncher):
        def wait_one(self, timeout):
            try:
                return super().wait_one(timeout)
            except (subprocess.CalledProcessError, RuntimeError, OSError):
                stop = getattr(self, "_stop_waiting", None)
                if stop is not None:
                    stop.wait(min(timeout, 5))  # no tight loop of ssh calls to an unreachable host
                raise TimeoutError("host not reachable now") from None

    class GuardedSSHEngineSet(SSHEngineSetLauncher):
        launcher_class = PatientSSHEngine

    return GuardedSSHEngineSet


def forget_host(cluster, entry: str) -> None:
    """Stop ipyparallel's pid polls of the engines started for the ``--hosts`` entry
    ``entry`` (``[user@]name``), whose host is lost: each poll would be an ssh to it."""
    from ipyparallel.cluster.launcher import SSHEngineSetLauncher

    for es in list((getattr(cluster, "engines", None) or {}).values()):
        if not isinstance(es, SSHEngineSetLauncher):
            continue
        for launcher in (getattr(es, "launchers", None) or {}).values():
            if getattr(launcher, "location", None) == entry:
                waiting = getattr(launcher, "_stop_waiting", None)
                if waiting is not None:
                    waiting.set()


def entries_of_ranks(hosts: str) -> list[str]:
    """The ``--hosts`` entry each rank was started for, in rank order (ranks follow the entries)."""
    return [slot.host for slot in parse_hosts(hosts) for _ in range(slot.n)]


def remaining_hosts(hosts: str, lost_entries: set[str], n: int | None = None) -> tuple[str, int]:
    """``--hosts`` without the lost entries, holding at most ``n`` ranks (default all that
    fit): (the new ``--hosts``, its ranks). Entries are filled in their order."""
    kept = [s for s in parse_hosts(hosts) if s.host not in lost_entries]
    room = sum(s.n for s in kept)
    left = room if n is None else min(n, room)
    out = []
    for s in kept:
        take = min(s.n, left)
        if take:
            out.append(f"{s.host}:{take}")
        left -= take
    return ",".join(out), sum(int(e.rpartition(":")[2]) for e in out)


def remote_env(python: str | None, lifeline_env: dict, slot: int) -> dict:
    """Environment of a remote engine: the lifeline and, with the same venv path, our PYTHONPATH."""
    env = dict(lifeline_env)
    env[ENV_HOST_SLOT] = str(slot)
    if python is None and os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    for var in ("OMP_NUM_THREADS",):
        if var in os.environ:
            env[var] = os.environ[var]
    return env


def remote_python(python: str | None) -> str:
    return python or sys.executable


def start(rs) -> None:
    """``--launcher ssh``: this engine's part of ``RankSet.start`` (one engine set per host)."""
    import time

    from .. import background
    from . import launchers

    cfg = rs.config
    slots = parse_hosts(cfg.hosts)
    remote = [network.ssh_hostname(s.host, cfg.ssh_config) for s in slots if not s.local]
    rs.listen_ip = network.listen_address(cfg.ip, remote)
    launchers.start_guarded_controller(rs)
    python = remote_python(cfg.python)
    for i, slot in enumerate(slots):
        env = remote_env(cfg.python, rs.lifeline.env(), i)
        if slot.local:
            rs.cluster.engine_launcher_class = "local"
            rs.cluster.start_engines_sync(slot.n, environment={ENV_HOST_SLOT: str(i)})
        else:
            rs.cluster.engine_launcher_class = engine_set_launcher()
            opts = ssh_options(cfg.ssh_config)
            rs.cluster.start_engines_sync(
                slot.n,
                engines={slot.host: slot.n},
                ssh_args=opts,
                scp_args=opts,
                remote_python=python,
                engine_cmd=engine_cmd(python),
                environment=env,
                remote_profile_dir=os.path.join(rs.cluster.profile_dir, "remote", str(i)),
            )
    rs.started_pids.extend(rs._launcher_pids())
    rs.client = rs._connect_client()
    rs._await_engines(time.monotonic() + rs._register_s(), [s.host for s in slots if not s.local])
    background.lower_processes(rs._controller_pids())
