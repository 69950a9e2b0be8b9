"""How engines are launched: ipyparallel's own launchers, chosen by a short name.

The workbench does not re-implement launching; it maps ``local``, ``mpi``,
``slurm`` and ``ssh`` onto ipyparallel's launcher classes and adds the few settings
that make them behave on a shared, small machine (a fast heartbeat so that a dead
rank is noticed in about a second; ``--oversubscribe`` for MPI when there are more
ranks than cores).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Protocol

from ...shared.wire import PRELOADS, READY

LAUNCHERS = ("local", "mpi", "slurm", "ssh", "ray")


@dataclass(frozen=True)
class JobState:
    """A reservation as its engine reports it: a Slurm job, a Ray placement group (the Lab shows it)."""

    job_id: str
    state: str  # PENDING, RUNNING, ... or GONE once it left the queue
    reason: str
    nodes: tuple[str, ...]


class Launcher(Protocol):
    """What a rank set asks of the engine that placed its ranks, once started.

    Modelled on ipyparallel's launcher classes. Each engine has one module whose
    ``start(rankset)`` starts the controller and the engines and returns once every engine
    registered (``local_launch``, ``slurm``, ``ssh``, ``ray_launcher``); RankSet then makes
    them ranks. An engine that holds resources of its own (Ray's placement group and
    actors) leaves this object on ``rankset.launcher``; Slurm's job is still ``job_id``.
    """

    name: str

    def queued(self) -> JobState | None:
        """The reservation while it waits for resources (shown as queued), else None."""

    def pids(self) -> dict[str, list[int]]:
        """host -> the pids this launcher started there (besides the ranks' own)."""

    def node_of(self, rank: int) -> str:
        """The engine's name for the node a rank runs on (shown by status)."""

    def allocation(self) -> str:
        """One line: where the ranks run."""

    def check_registering(self) -> None:
        """Raise, with what is known, if a rank ended before it registered."""

    def cancel(self) -> None:
        """Give up a reservation that waits (the start then ends)."""

    def stop(self) -> None:
        """End exactly what this launcher started."""


# the controller's heartbeat: its periods and allowed silences (heartbeat_args says why)
HEARTBEAT_MS = 300
REGISTERING_HEARTBEAT_MS = 100
SETTLED_HEARTBEAT_MS = 3000
SILENCE_LOCAL_MS = 60_000
SILENCE_REMOTE_MS = 1500

LEAF_RANKS = 128  # the most ranks a leaf of the broadcast tree serves (broadcast_depth says why)

REGISTRATION_S = 600  # guarded launches: the notebook's own wait (RankSet) ends first, with a message

CONTROLLER_CMD = [
    sys.executable,
    "-c",
    "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "controller_process.py"),
]

FRAMEWORKS = tuple(PRELOADS)  # what the ranks run: torch (torch.distributed) or jax (jax.distributed)


def preload_command(framework: str = "torch") -> str:
    """Run by each engine as soon as it is up: the rank bootstrap then finds its framework imported."""
    return "import " + ", ".join(PRELOADS[framework])


def cluster_kwargs(
    launcher: str, n: int, *, options: dict | None = None, guarded: bool = False, framework: str = "torch"
) -> dict:
    """Keyword arguments for ``ipyparallel.Cluster`` for this launcher.

    ``options`` are passed through to ipyparallel (e.g. ``{"engines": {...}}`` or
    config for Slurm/SSH such as ``SSHEngineSetLauncher.engines``); ``framework`` decides
    what the engines import first (a JAX rank never imports torch).
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}: use one of {', '.join(LAUNCHERS)}")
    from traitlets.config import Config

    cfg = Config()
    kwargs: dict = {
        # ipyparallel logs every engine exit to stdout; the workbench reports exits itself
        "log": _quiet_logger(),
        "n": n,
        "delay": 0,
        "log_level": 30,
        "config": cfg,
        # the controller runs in its own process: its settings go on its command line
        "controller_args": [
            *heartbeat_args(n, patient=launcher in ("local", "mpi") or guarded),
            f"--IPController.broadcast_scheduler_depth={broadcast_depth(n)}",
        ],
    }
    if guarded:
        # an engine completes registration only after importing torch (PRELOAD), which on a
        # busy node can outlast the controller's default 30 s: it would drop the engine half-way
        kwargs["controller_args"].append(f"--IPController.registration_timeout={REGISTRATION_S}")
    # the controller ends with the notebook process, wherever the ranks run (controller_process.py)
    cfg.LocalControllerLauncher.controller_cmd = CONTROLLER_CMD
    # import torch while the other engines register, not after (start-up time)
    cfg.EngineLauncher.engine_args = ["--IPEngine.startup_command=" + preload_command(framework)]
    if launcher == "mpi":
        kwargs["engines"] = "mpi"
        # no shared-memory transport: the ranks talk through torch.distributed, MPI only
        # launches them, and Open MPI's vader segments (4 MB each in /dev/shm) outlive
        # engines that are stopped by a signal
        mpi_args = ["--oversubscribe", "--mca", "btl", "self,tcp"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            mpi_args.append("--allow-run-as-root")
        cfg.MPILauncher.mpi_args = mpi_args
    elif launcher in ("slurm", "ssh"):
        kwargs["engines"] = launcher
    if launcher == "local":
        # engines on this host read the controller's connection file themselves (they
        # wait for it), so they start while the controller is still starting rather
        # than after it (ipyparallel would first wait for the controller to hand it over)
        kwargs["send_engines_connection_env"] = False
        cfg.EngineLauncher.engine_args.append("--IPEngine.wait_for_url_file=120")
        # each engine imports torch as its first step, while the controller is still coming
        # up (the startup command then finds it imported)
        cfg.LocalEngineSetLauncher.engine_cmd = [
            sys.executable,
            "-m",
            "workbench.engine.preload",
            *(["--framework", framework] if framework != "torch" else []),
        ]
        # no nanny process per engine: ranks on this host are signalled by pid
        # (``RankSet.interrupt``) and watched by pid (``health.Watcher``); a nanny costs a
        # Python start that each engine waits for before registering
        cfg.EngineLauncher.engine_args.append("--IPEngine.enable_nanny=False")
    for key, value in (options or {}).items():
        if key == "config":
            cfg.merge(value)
        else:
            kwargs[key] = value
    return kwargs


def broadcast_depth(n: int) -> int:
    """The broadcast tree's depth for ``n`` ranks: ipyparallel's own 1 (two leaves) up to
    ``2 * LEAF_RANKS`` ranks, then as deep as it takes for leaves of at most ``LEAF_RANKS``.

    The tree has 2**depth leaf schedulers, rank r on leaf r % 2**depth; every message a leaf
    sends to one of its ranks carries the leaf's whole target list, so a leaf's work per call
    grows with the square of its ranks. Each level is one more scheduler process per node (what
    the tree costs: docs/scale.md)."""
    depth = 1
    while n > LEAF_RANKS * 2**depth:
        depth += 1
    return depth


def heartbeat_args(n: int, *, patient: bool) -> list[str]:
    """The controller's heartbeat settings for ``n`` ranks; ``patient``: a minute of silence
    before an engine is dropped (deaths are seen otherwise), else 1.5 s and always fast.

    The controller drops an engine after ``period * max_heartmonitor_misses`` of silence. A
    short period makes engines register fast (the controller admits a new engine on the second
    beat after it answers one), so the controller beats every ``REGISTERING_HEARTBEAT_MS``
    until every rank beats (every beat an engine waits for is start-up time), then every
    ``SETTLED_HEARTBEAT_MS`` (ipyparallel's default; the period engines are told): a beat wakes
    the heart monitor, each rank's heart thread and ZMQ's threads, on the cores the ranks train
    on (``controller_process.settling_heartbeat``).

    Ranks on this host are watched by pid (``health.Watcher``: a death is seen at once), so
    there the controller may wait a minute of silence: a rank stopped with SIGSTOP or under a
    debugger is "stuck", not dead, and must still be there after SIGCONT. Ranks on other hosts
    without a guard have only the heartbeat: 1.5 s of silence and they are reported dead (the
    fast beat stays on); with a guard (Slurm, SSH: ``workbench.engine.guard``) a death is
    reported at once with its exit status, and the heartbeat may be as patient as for local
    ranks (a rank importing torch on a busy node misses beats while it registers)."""
    if not patient:
        return [
            f"--HeartMonitor.period={HEARTBEAT_MS}",
            f"--HeartMonitor.max_heartmonitor_misses={SILENCE_REMOTE_MS // HEARTBEAT_MS}",
        ]
    return [
        f"--HeartMonitor.period={SETTLED_HEARTBEAT_MS}",
        f"--HeartMonitor.max_heartmonitor_misses={SILENCE_LOCAL_MS // SETTLED_HEARTBEAT_MS}",
        f"--workbench-heartbeat={REGISTERING_HEARTBEAT_MS},{n}",
    ]


class ForkedRanks:
    """The one process that imports the ranks' framework (torch or jax) and forks the ranks on this host
    (``workbench.engine.preload --fork``).

    Started before the notebook imports ipyparallel, so that its imports overlap with the
    notebook's and the controller's, or earlier still, as a standby (``standby.py``:
    ``standby_of`` is the notebook's pid, which it watches until it is handed a start);
    :meth:`setup` then tells it how many ranks to fork and the cluster they join. Until
    then its output goes to a temporary file that :meth:`output` reads back if it fails.
    """

    def __init__(self, framework: str = "torch", *, standby_of: int | None = None, imports: tuple[str, ...] = ()):
        import subprocess
        import tempfile

        self.framework = framework
        self.n: int | None = None
        # what the ranks inherit: a standby serves a start only while these still hold
        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self._early = tempfile.TemporaryFile()
        cmd = [sys.executable, "-m", "workbench.engine.preload", "--fork", "--framework", framework]
        if standby_of:
            cmd += ["--standby-of", str(standby_of)]
        if imports:  # imported before the forks too (preload.own_imports)
            cmd += ["--import", ",".join(imports)]
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=self._early,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # like ipyparallel's launchers: no signal from the notebook's group
        )
        self.pid = self.proc.pid
        self.exit_dir: str | None = None
        self.log: str | None = None

    def setup(self, n: int, cluster, engine_args: list[str], exit_dir: str) -> None:
        """Fork ``n`` ranks that join ``cluster``; they log to ipyparallel's engine log and
        their exits go to ``exit_dir``."""
        import json

        self.n = n
        self.exit_dir = exit_dir
        self.log = os.path.join(cluster.profile_dir, "log", f"ipengine-{cluster.cluster_id}-ranks.log")
        os.makedirs(os.path.dirname(self.log), exist_ok=True)
        line = {
            "ranks": n,
            "env": {"IPP_CLUSTER_ID": cluster.cluster_id, "IPP_PROFILE_DIR": cluster.profile_dir},
            "engine_args": list(engine_args),
            "exit_dir": exit_dir,
            "log": self.log,
        }
        try:
            self.proc.stdin.write((json.dumps(line) + "\n").encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it has ended: the wait for the ranks says so, with its output

    def ended(self) -> int | None:
        return self.proc.poll()

    def ready(self) -> bool:
        """Whether its imports are done (it waits for :meth:`setup`): what it printed so far says so."""
        try:  # pread: the file's offset is shared with the process, which writes there
            return READY.encode() in os.pread(self._early.fileno(), 1 << 16, 0)
        except (OSError, ValueError):  # closed
            return False

    def output(self, limit: int = 2000) -> str:
        """What it printed (before and after :meth:`setup`), the last ``limit`` characters."""
        self._early.seek(0)
        text = self._early.read().decode(errors="replace")
        if self.log and os.path.exists(self.log):
            with open(self.log, errors="replace") as f:
                text += f.read()
        return text[-limit:]

    def close(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()  # a process still waiting for its setup ends
        self.proc.poll()
        self._early.close()


def _quiet_logger():
    import logging

    log = logging.getLogger("workbench.ipyparallel")
    log.setLevel(logging.ERROR)
    log.propagate = False
    return log


def gpu_ids() -> list[int]:
    """GPU indices visible to the notebook, found without importing torch or CUDA.

    The notebook kernel must not initialise CUDA (a forked or re-launched rank could
    not use it then), so this reads ``CUDA_VISIBLE_DEVICES`` or asks ``nvidia-smi``.
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [int(x) for x in visible.split(",") if x.strip().isdigit()]
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return list(range(sum(1 for line in out.splitlines() if line.strip().startswith("GPU "))))


def start_guarded_controller(rs, **options) -> dict:
    """Slurm, SSH, Ray: the lifeline and the controller on ``rs.listen_ip`` (set by the
    engine's ``start`` first), for engines that each run under a guard. Returns the
    ``ipyparallel.Cluster`` keyword arguments (``options`` merged in)."""
    import ipyparallel as ipp

    from . import controller_watch
    from .lifeline import Lifeline

    cfg = rs.config
    rs.lifeline = Lifeline(rs.listen_ip, rs.secret, on_exit=rs._guard_exit, on_lost=rs._host_lost)
    kwargs = cluster_kwargs(cfg.launcher, cfg.n, guarded=True)
    kwargs["controller_ip"] = rs.listen_ip
    if cfg.profile_dir:
        kwargs["profile_dir"] = cfg.profile_dir
    kwargs.update(options)
    rs.cluster = ipp.Cluster(**kwargs)
    controller_watch.start_controller(rs.cluster)
    rs._note_controller()
    return kwargs
