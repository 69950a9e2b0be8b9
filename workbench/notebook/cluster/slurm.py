"""Ranks as one Slurm job: the request, our own batch script, and watching the queue.

ipyparallel's Slurm launcher drops its ``options`` from its default batch script, so
the workbench writes the whole script itself: every option the user gave becomes an
``#SBATCH`` line. While the job waits for its allocation the notebook shows
``queued: job N PENDING (Reason)``; a reason that can never clear (the request exceeds
what the partition holds) ends the start with Slurm's own words, the job cancelled.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from dataclasses import dataclass

from .launchers import JobState

# Pending reasons that no amount of waiting resolves: the request exceeds what the
# partition, account or QOS allows (Slurm's reason codes).
NEVER_RUNS = {
    "PartitionConfig",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "BadConstraints",
    "AccountNotAllowed",
    "InvalidAccount",
    "InvalidQOS",
    "QOSNotAllowed",
    "PartitionDown",
    "PartitionInactive",
    "JobHeldAdmin",
    "DependencyNeverSatisfied",
}
_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$")


class SlurmError(RuntimeError):
    """sbatch refused the job, or the job can never run / ended before its ranks came up."""


@dataclass(frozen=True, kw_only=True)
class SlurmRequest:
    """What ``%distrain start --launcher slurm`` asks of Slurm."""

    nodes: int | None = None
    gpus_per_node: int | None = None
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    sbatch: tuple[str, ...] = ()  # extra sbatch options, one token each

    def validate(self) -> None:
        for name in ("nodes", "gpus_per_node"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"--{name.replace('_', '-')} must be a whole number >= 1, got {value!r}")
        if self.time is not None and not _TIME.match(self.time):
            raise ValueError(f"--time {self.time!r} is not a Slurm time: use minutes, H:MM:SS or D-HH:MM:SS")
        for opt in self.sbatch:
            if not opt.startswith("-"):
                raise ValueError(f'--sbatch takes sbatch options such as "--constraint=h100"; {opt!r} is not one')

    def lines(self, n: int) -> list[str]:
        """The ``#SBATCH`` lines of this request for ``n`` ranks."""
        out = [f"--ntasks={n}"]
        if self.nodes:
            out.append(f"--nodes={self.nodes}")
            out.append(f"--ntasks-per-node={-(-n // self.nodes)}")
        if self.gpus_per_node:
            out.append(f"--gpus-per-node={self.gpus_per_node}")
        if self.partition:
            out.append(f"--partition={self.partition}")
        if self.time:
            out.append(f"--time={self.time}")
        if self.account:
            out.append(f"--account={self.account}")
        out.extend(self.sbatch)
        return [f"#SBATCH {shlex.quote(o)}" for o in out]


def parse_sbatch(text: str | None) -> tuple[str, ...]:
    return tuple(shlex.split(text)) if text else ()


def batch_template(request: SlurmRequest, n: int) -> str:
    """The whole batch script (ipyparallel fills ``{program_and_args}`` and the rest)."""
    lines = [line.replace("{", "{{").replace("}", "}}") for line in request.lines(n)]
    return "\n".join(
        [
            "#!/bin/sh",
            "#SBATCH --export=ALL",
            "#SBATCH --job-name=workbench-{cluster_id}",
            "#SBATCH --output={output_file}",
            *lines,
            # one task per rank; the guard (workbench.engine.guard) wraps each engine
            "srun --kill-on-bad-exit=0 {program_and_args}",
            "",
        ]
    )


def launcher_class():
    """ipyparallel's Slurm engine launcher, with sbatch's own error message kept."""
    from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

    class WorkbenchSlurmEngineSetLauncher(SlurmEngineSetLauncher):
        def _run_command(self, command, **kwargs):
            r = subprocess.run(command, capture_output=True, text=True, **kwargs)
            if r.returncode != 0 and command[:1] != self.submit_command[:1]:
                # scancel of a job already gone (the workbench cancels first): nothing left to do
                return r.stdout + r.stderr
            if r.returncode != 0:
                msg = (r.stderr or r.stdout).strip().replace("sbatch: error: ", "")
                raise SlurmError(f"{command[0]} refused the request: {msg}")
            return r.stdout

    return WorkbenchSlurmEngineSetLauncher


def job_state(job_id: str) -> JobState:
    r = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r|%N"], capture_output=True, text=True, timeout=30)
    line = r.stdout.strip().splitlines()[0] if r.stdout.strip() else ""
    if not line:
        return JobState(job_id, "GONE", "", ())
    state, reason, nodelist = (line.split("|") + ["", ""])[:3]
    return JobState(job_id, state, reason, expand_nodes(nodelist))


def expand_nodes(nodelist: str) -> tuple[str, ...]:
    if not nodelist or nodelist in ("(null)", "n/a"):
        return ()
    r = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    return tuple(r.stdout.split()) or (nodelist,)


def cancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], capture_output=True, timeout=30)


def wait_until_gone(job_id: str, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if job_state(job_id).state == "GONE":
            return True
        time.sleep(0.2)
    return False


def queued_line(js: JobState) -> str:
    return f"queued: job {js.job_id} {js.state} ({js.reason})"


def hopeless(js: JobState) -> bool:
    return js.state == "PENDING" and any(js.reason.startswith(r) for r in NEVER_RUNS)


def node_route() -> str:
    """This host's address toward the first available node of the cluster (loopback on a one-node Slurm)."""
    from . import network

    r = subprocess.run(["sinfo", "-h", "-N", "-o", "%o %t"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        raise SlurmError(f"sinfo failed ({(r.stderr or r.stdout).strip()}): is Slurm reachable from this host?")
    for line in r.stdout.splitlines():
        addr, _, state = line.partition(" ")
        if addr and state.strip().rstrip("*~#") in ("idle", "mix", "alloc", "comp"):
            return network.toward(addr)
    raise SlurmError("no Slurm node is up (sinfo lists none idle, mixed or allocated); pass --ip to choose the address")


def start(rs) -> None:
    """``--launcher slurm``: this engine's part of ``RankSet.start`` (one job; queued, then its engines)."""
    import os

    from .. import background
    from . import launchers, network, ssh

    cfg = rs.config
    rs.listen_ip = network.listen_address(cfg.ip, []) if cfg.ip else node_route()
    launchers.start_guarded_controller(rs, engines=launcher_class())
    request = cfg.slurm or SlurmRequest()
    env = ssh.remote_env(cfg.python, rs.lifeline.env(), 0)
    # ipyparallel writes the script into the working directory unless given a path
    os.makedirs(rs.state_dir(), exist_ok=True)
    script = os.path.join(rs.state_dir(), "slurm_engines.sbatch")
    esid = rs.cluster.start_engines_sync(
        cfg.n,
        batch_template=batch_template(request, cfg.n),
        batch_file_name=script,
        engine_cmd=ssh.engine_cmd(ssh.remote_python(cfg.python)),
        environment=env,
    )
    rs.job_id = rs.cluster.engines[esid].job_id
    rs.client = rs._connect_client()
    await_allocation(rs)
    background.lower_processes(rs._controller_pids())


def await_allocation(rs) -> None:
    """Wait for the job's allocation (showing it live), then for its engines."""
    import socket

    from ...shared.errors import Interrupted
    from . import network

    shown = None
    while True:
        if rs._cancel.is_set():
            raise Interrupted(f"start cancelled: Slurm job {rs.job_id} cancelled while {shown or 'queued'}")
        js = job_state(rs.job_id)
        if js.state == "PENDING":
            line = queued_line(js)
            if line != shown:
                rs.progress(line)
                rs._queue_changed(js)
                shown = line
            if hopeless(js):
                raise SlurmError(
                    f"Slurm job {rs.job_id} can never run: {js.reason}; it was cancelled. "
                    "Ask for what the partition holds (sinfo shows it)"
                )
            time.sleep(0.5)
            continue
        if js.state in ("RUNNING", "CONFIGURING", "COMPLETING") and js.nodes:
            rs.nodes = js.nodes
            here = {socket.gethostname(), socket.gethostname().split(".")[0]}
            away = [h for h in js.nodes if h not in here]
            if away and network.is_loopback(rs.listen_ip):
                raise network.AddressError(
                    f"Slurm gave nodes {', '.join(away)}, which cannot reach this notebook at {rs.listen_ip}: "
                    "pass --ip with this host's address toward them"
                )
            rs.progress(f"job {rs.job_id} running on {', '.join(js.nodes)}")
            rs._queue_changed(js)
            break
        if js.state not in ("RUNNING", "CONFIGURING"):
            raise SlurmError(f"Slurm job {rs.job_id} ended ({js.state}) before its ranks came up" + batch_output(rs))
        time.sleep(0.2)
    rs._await_engines(time.monotonic() + rs._register_s(), list(rs.nodes))


def batch_output(rs) -> str:
    """The end of the job's output file (why it ended before its ranks came up)."""
    import os

    es = next(iter((rs.cluster.engines or {}).values()), None)
    path = getattr(es, "output_file", None)
    if path and os.path.exists(path):
        with open(path, errors="replace") as f:
            return ":\n" + f.read()[-2000:]
    return ""
