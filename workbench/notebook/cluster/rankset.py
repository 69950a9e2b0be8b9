"""A set of persistent rank processes on ipyparallel engines (notebook side).

:class:`RankSet` starts N engines through one engine's module (``local_launch``,
``slurm``, ``ssh``, ``ray_launcher``: each its ``start``), gives
them stable ranks 0..N-1, bootstraps ``torch.distributed`` on each, runs code and
functions on all or some of them, and stops exactly the processes it started.
It never imports torch in the notebook process.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import threading
import time
import weakref
from dataclasses import dataclass, field

from ...engine import rpc
from ...shared import output_cut
from ...shared.errors import Interrupted, NotRunning, RankDied
from ...shared.ranges import parse_ranks
from ...shared.wire import LARGE_LOCAL_FROM
from ..shell_compat import mark_kernelless
from . import code_sync, controller_watch, fanout, health, launchers, local_launch, network, ray_launcher, slurm, ssh
from .gpu_plan import plan_gpus
from .rank_call import RankCall


def _is_ssh(engine_set) -> bool:
    """An engine set started over SSH (its processes are on other hosts)."""
    from ipyparallel.cluster.launcher import SSHEngineSetLauncher

    return isinstance(engine_set, SSHEngineSetLauncher)


def _in_flight(call) -> bool:
    return call is not None and not call.ar.ready()


BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True, kw_only=True)
class RankSetConfig:
    """How to start a rank set; also the schema of ``%distrain start`` options."""

    n: int = 2
    backend: str = "auto"
    launcher: str = "local"
    timeout: float = 300.0  # collective timeout (s) of the process group
    threads: int | None = None  # torch/OMP threads per rank; default cores // ranks
    launcher_options: dict = field(default_factory=dict)
    profile_dir: str | None = None
    sys_path: tuple[str, ...] = ()  # extra import paths for the ranks (cwd is always added)
    ip: str | None = None  # address the notebook listens on for remote ranks (default: toward them)
    hosts: str | None = None  # ssh: "hostA:2,hostB:2"
    ssh_config: str | None = None  # ssh: an ssh_config file (ssh -F)
    python: str | None = None  # ssh/slurm: the ranks' python (default: this one's path)
    slurm: slurm.SlurmRequest | None = None
    framework: str = "torch"  # what the ranks initialise: torch.distributed, or jax.distributed
    nccl_env: dict = field(default_factory=dict)  # NCCL_* each rank sets before its process group
    ray: ray_launcher.RayRequest | None = None
    sync: code_sync.SyncSettings = field(default_factory=code_sync.SyncSettings)  # folders for the other hosts

    def validate(self) -> None:
        """Refuse bad settings before any process is started."""
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"-n must be a whole number of ranks >= 1, got {self.n!r}")
        if self.framework not in launchers.FRAMEWORKS:
            raise ValueError(
                f"--framework {self.framework!r} is not known: use one of {', '.join(launchers.FRAMEWORKS)}"
            )
        if self.framework == "jax":
            self._validate_jax()
        if self.hosts is not None and self.launcher != "ssh":
            raise ValueError("--hosts goes with --launcher ssh")
        if (self.ssh_config and self.launcher != "ssh") or (
            self.python and self.launcher not in ("ssh", "slurm", "ray")
        ):
            raise ValueError("--ssh-config and --python go with --launcher ssh (--python also with slurm and ray)")
        if self.ssh_config and not os.path.isfile(self.ssh_config):
            raise ValueError(f"--ssh-config {self.ssh_config}: no such file")
        if self.slurm is not None:
            if self.launcher != "slurm":
                raise ValueError(
                    "--nodes/--gpus-per-node/--partition/--time/--account/--sbatch go with --launcher slurm"
                )
            self.slurm.validate()
            if self.slurm.nodes and self.slurm.nodes > self.n:
                raise ValueError(f"--nodes {self.slurm.nodes} is more nodes than ranks (-n {self.n})")
        if self.ray is not None:
            if self.launcher != "ray":
                raise ValueError("--address/--cpus-per-rank/--gpus-per-rank go with --launcher ray")
            self.ray.validate()
        if self.launcher == "ssh" and self.hosts is not None:
            slots = ssh.parse_hosts(self.hosts)
            total = sum(s.n for s in slots)
            if total != self.n:
                raise ValueError(
                    f"--hosts {self.hosts} holds {total} ranks but -n is {self.n}: give -n {total} or leave -n out"
                )
        if self.launcher == "ssh" and self.hosts is None and not self.launcher_options:
            raise ValueError("--launcher ssh needs --hosts, e.g. --hosts node1:2,node2:2")
        if self.ip is not None and self.launcher not in ("ssh", "slurm", "ray"):
            raise ValueError(
                f"--ip goes with --launcher ssh, slurm or ray (with --launcher {self.launcher} the "
                "ranks reach the controller on 127.0.0.1)"
            )
        if self.ip is not None:
            network.check_ip(self.ip)
        self.sync.validate("ssh" if self.launcher == "ssh" and self.launcher_options else self.launcher)
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend {self.backend!r} is not known: use one of {', '.join(BACKENDS)}")
        if self.launcher not in launchers.LAUNCHERS:
            raise ValueError(f"--launcher {self.launcher!r} is not known: use one of {', '.join(launchers.LAUNCHERS)}")
        if not self.timeout or self.timeout <= 0:
            raise ValueError(f"--timeout must be a positive number of seconds, got {self.timeout!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads!r}")
        if not self.remote_launch() and self.backend != "gloo" and self.framework == "torch":
            plan_gpus(self.backend, self.n, launchers.gpu_ids())  # refuses n > GPUs before any start

    def _validate_jax(self) -> None:
        """JAX ranks: forked on this host, CPU collectives over gloo (``engine.jax_runtime``)."""
        if self.launcher != "local" or self.launcher_options:
            raise ValueError(
                f"--framework jax starts its ranks with --launcher local (got --launcher {self.launcher}); "
                "leave --launcher out"
            )
        if self.backend not in ("auto", "gloo"):
            raise ValueError(
                f"--backend {self.backend} is torch's: JAX ranks run their collectives over gloo on CPU; "
                "leave --backend out (or --backend gloo) with --framework jax"
            )

    def remote_launch(self) -> bool:
        """Slurm/SSH/Ray ranks pin from the GPUs of their own host, not this one's."""
        return self.launcher in ("slurm", "ssh", "ray") and not self.launcher_options

    def threads_per_rank(self) -> int:
        return self.threads or max(1, (os.cpu_count() or 1) // self.n)


class RankSet:
    """Persistent ranks. Use :meth:`start`; then :meth:`apply`, :meth:`execute`, :meth:`stop`."""

    def __init__(self, config: RankSetConfig):
        config.validate()
        self.config = config
        self.cluster = None
        self.client = None
        self.engine_ids: list[int] = []  # index = rank
        self.info: list[dict] = []  # bootstrap description per rank
        self.store_file: str | None = None  # the process group's file store (large sets on one host)
        self.procs: list[health.RankProcess] = []
        self.watcher: health.Watcher | None = None
        self.started_pids: list[int] = []
        self.stopped = False
        self.start_seconds: float | None = None
        self._views: dict[tuple[int, ...], object] = {}
        self._fan_views: dict[tuple[int, ...], object] = {}
        # calls on this many ranks or more go through the controller's broadcast tree (fanout)
        self.fanout_from = fanout.FANOUT_FROM
        self.last_cell: str | None = None  # the code of the latest cell sent to the ranks
        # fanned calls not yet answered: the controller's queues do not see the broadcast tree's
        self._fanned_calls: list[weakref.ref] = []
        self.secret = secrets.token_bytes(32)  # signs the event stream and the guards' lines
        self.listen_ip = "127.0.0.1"  # where the controller, event stream and lifeline listen
        self.lifeline = None
        self._dropped: dict[tuple[int, int], float] = {}  # when dead() first saw (rank, engine id) dropped
        # (pid, start time) of the controller, which leads its own session: the scheduler
        # processes it forks stay in that session after it is gone (RankSet.stop)
        self._controller_session: tuple[int, float] | None = None
        self.forked: launchers.ForkedRanks | None = None  # local ranks: the process that forks them
        self.preloaded = False  # that process was the kernel's standby (its torch imported early)
        self.replacements: list[launchers.ForkedRanks] = []  # those that forked replacement ranks (replacements.py)
        self.spare: launchers.ForkedRanks | None = None  # the next replacement's, imported ahead (replacements.spare)
        self.lighthouse = None  # a fault-tolerant run's torchft lighthouse (cluster.lighthouse), ended with the set
        self.exit_dir: str | None = None  # where it writes their exit statuses
        self.job_id: str | None = None  # slurm
        self.launcher: launchers.Launcher | None = None  # ray: its placement group and actors
        self.nodes: tuple[str, ...] = ()
        self.progress = print  # live lines while starting (queued: job N PENDING (Reason))
        self.on_queue = None  # fn(JobState) while a Slurm job waits and when it gets its nodes
        self._cancel = threading.Event()
        self._finished = threading.Event()
        self.code_sync: code_sync.CodeSync | None = None  # the folders on the other hosts (code_sync.py)

    # ------------------------------------------------------------------ start
    @classmethod
    def start(cls, config: RankSetConfig | None = None, *, progress=None, on_created=None, **kwargs) -> RankSet:
        """Start engines, assign ranks and initialise the process group on every rank.

        ``progress(line)`` gets live lines while starting (a queued Slurm job);
        ``on_created(rankset)`` is called at once, so that another thread can
        :meth:`cancel` a start that waits in a queue.
        """
        config = config or RankSetConfig(**kwargs)
        try:
            return cls._start_once(config, progress, on_created)
        except controller_watch.ControllerEnded as ended:
            # a part of the controller loses its port when another process takes it between the
            # controller's choice and the part's bind: a new controller chooses other ports
            (progress or print)(f"{ended}; starting a new controller")
            return cls._start_once(config, progress, on_created)

    @classmethod
    def _start_once(cls, config: RankSetConfig, progress, on_created) -> RankSet:
        self = cls(config)
        if progress is not None:
            self.progress = progress
        if on_created is not None:
            on_created(self)
        t0 = time.perf_counter()
        try:
            # each engine's module starts the controller and the engines, and returns once
            # every engine registered; RankSet then makes them ranks (_bootstrap)
            if config.launcher == "ray":
                self.launcher = ray_launcher.RayLauncher(config.ray or ray_launcher.RayRequest(), config.n)
                ray_launcher.start(self)
            elif config.launcher == "slurm" and not config.launcher_options:
                slurm.start(self)
            elif config.launcher == "ssh" and not config.launcher_options:
                ssh.start(self)
            else:
                local_launch.start(self)
            code_sync.check_environment(self)  # refuses a host with another torch before any rank is made
            self._bootstrap()
            code_sync.begin(self)  # the notebook's folders on the other hosts before the first cell
        except BaseException:
            self.stop()
            raise
        finally:
            self._finished.set()
        self.start_seconds = time.perf_counter() - t0
        return self

    def _connect_client(self):
        mark_kernelless()  # a terminal IPython's shell, so that ranks' widgets do not stall calls
        try:
            return self.cluster.connect_client_sync()
        except (TimeoutError, RuntimeError):  # no hub answered: a controller that ended is named as such
            controller_watch.check(self.cluster)
            raise

    def cancel(self, timeout: float = 60.0) -> None:
        """Abandon a start in progress (a job waiting in the queue): cancelled, nothing left."""
        self._cancel.set()
        if self.job_id:
            slurm.cancel(self.job_id)
        if self.launcher is not None:
            self.launcher.cancel()
        self._finished.wait(timeout)

    def _queue_changed(self, js) -> None:
        if self.on_queue is not None:
            try:
                self.on_queue(js)
            except Exception:  # an observer (the Lab registry) never fails a start
                pass

    def _await_engines(self, deadline: float, remote_hosts: list[str]) -> None:
        """All engines registered, or a message naming the address they could not reach."""
        n = self.config.n
        while True:
            try:
                self.client.wait_for_engines(n, timeout=0.25, block=True, interactive=False)
                return
            except TimeoutError:
                pass
            if self._cancel.is_set():
                raise Interrupted("start cancelled while the ranks were registering")
            controller_watch.check(self.cluster)
            if self.launcher is not None:
                self.launcher.check_registering()
            if self.job_id and slurm.job_state(self.job_id).state not in ("RUNNING", "CONFIGURING", "COMPLETING"):
                raise slurm.SlurmError(
                    f"Slurm job {self.job_id} ended before its ranks came up" + slurm.batch_output(self)
                )
            if time.monotonic() > deadline:
                url = self._controller_url()
                said = sorted(self.lifeline.hosts_said_hello()) if self.lifeline else []
                raise TimeoutError(
                    f"{len(self.client.ids)} of {n} ranks registered; ranks on {', '.join(remote_hosts) or 'the nodes'} "
                    f"did not reach the controller at {url} (lifeline {self.lifeline.address if self.lifeline else '-'}, "
                    f"reached from: {', '.join(said) or 'no host'}): the notebook's address {self.listen_ip} and "
                    "its ports must be open to them; choose the interface with --ip"
                    + (slurm.batch_output(self) if self.job_id else "")
                )

    def _register_s(self) -> float:
        """How long engines may take to register once started (each imports torch first)."""
        return max(180.0, 30.0 * self.config.n)

    def _controller_url(self) -> str:
        try:
            import json

            path = os.path.join(
                self.cluster.profile_dir, "security", f"ipcontroller-{self.cluster.cluster_id}-engine.json"
            )
            with open(path) as f:
                info = json.load(f)
            return f"{info.get('interface', 'tcp://' + self.listen_ip)}:{info.get('registration', '?')}"
        except (OSError, ValueError):
            return f"tcp://{self.listen_ip}"

    def _guard_exit(self, host: str, pid: int, code: int) -> None:
        """A guarded engine ended: record it, named with host and exit status."""
        if self.watcher is None:
            return
        for p in self.procs:
            if p.pid == pid and p.host == host:
                self.watcher.mark_dead(p.rank, health.describe_exit(code), exit_code=code)

    def _host_lost(self, host: str, silent_s: float) -> None:
        """Every guard on ``host`` fell silent (a link down, the host gone): its ranks are dead."""
        if self.watcher is None:
            return
        if self.config.launcher == "ssh" and self.config.hosts:
            for entry in self.lost_entries():
                ssh.forget_host(self.cluster, entry)
        for p in self.procs:
            if p.host == host:
                self.watcher.mark_dead(
                    p.rank, f"lost with its host: no heartbeat from {host} for {silent_s:.1f} s", host_lost=True
                )

    @property
    def lost_hosts(self) -> list[str]:
        """Hosts named lost: every guard there stopped beating (``lifeline.HOST_SILENCE_S``)."""
        return sorted(self.lifeline.lost) if self.lifeline is not None else []

    def lost_entries(self) -> set[str]:
        """The ``--hosts`` entries (``[user@]name``) whose ranks ran on a lost host (SSH)."""
        lost = set(self.lost_hosts)
        if not lost or self.config.launcher != "ssh" or not self.config.hosts:
            return set()
        entries = ssh.entries_of_ranks(self.config.hosts)
        return {entries[p.rank] for p in self.procs if p.host in lost and p.rank < len(entries)}

    def _actor_died(self, bundle: int, cause: str) -> None:
        """A Ray rank's actor died (rank = bundle): named with Ray's cause, beside any exit status."""
        if self.watcher is None or bundle >= len(self.procs):
            return
        self.watcher.mark_dead(bundle, f"lost its Ray actor: {cause}")
        self.watcher.add_cause(bundle, cause, f"Ray: {cause}")

    def _note_controller(self) -> None:
        """Remember the controller's pids and its session (see :meth:`stop`)."""
        self.started_pids.extend(self._controller_pids())
        ctl = getattr(self.cluster, "controller", None)
        pid = getattr(ctl, "pid", None) or getattr(getattr(ctl, "process", None), "pid", None)
        if pid and self._controller_session is None:
            self._controller_session = health.session_of(pid)

    def _controller_pids(self) -> list[int]:
        ctl = getattr(self.cluster, "controller", None)
        pid = getattr(ctl, "pid", None) or getattr(getattr(ctl, "process", None), "pid", None)
        return health.process_tree([pid]) if pid else []

    def _launcher_pids(self) -> list[int]:
        pids = []
        for es in (self.cluster.engines or {}).values():
            if _is_ssh(es):
                continue  # their pids are on other hosts: the guards end those
            for launcher in (getattr(es, "launchers", None) or {}).values():
                pid = getattr(launcher, "pid", None)
                if pid and pid > 0:
                    pids.append(pid)
            pid = getattr(es, "pid", None)  # mpiexec for the MPI launcher
            if pid and pid > 0:
                pids.append(pid)
        return pids

    def _launcher_procs(self) -> dict[int, object]:
        """pid -> psutil.Process held by ipyparallel's local launchers (they reap the child)."""
        out = {}
        for es in (self.cluster.engines or {}).values():
            for launcher in (getattr(es, "launchers", None) or {}).values():
                proc = getattr(launcher, "process", None)
                if proc is not None and getattr(proc, "pid", None):
                    out[proc.pid] = proc
        return out

    def _bootstrap(self) -> None:
        cfg = self.config
        ids = sorted(self.client.ids)[: cfg.n]
        here = socket.gethostname()
        if self.exit_dir is not None:
            # forked on this host by one process (launchers.forking_cmd): nothing to ask them;
            # ranks follow engine ids, and each rank's pid comes back from its bootstrap
            local = {"host": here, "pid": None, "addr": "127.0.0.1", "slot": None}
            idents = [{**local, "launcher_rank": None, "launcher_local_rank": None} for _ in ids]
        else:
            idents = self.client[ids].apply_async(rpc.handle, rpc.Identity(toward=self.listen_ip)).get(timeout=60)
        order = sorted(
            range(len(ids)),
            key=lambda i: (
                idents[i]["slot"] if idents[i]["slot"] is not None else 0,
                idents[i]["launcher_rank"] if idents[i]["launcher_rank"] is not None else ids[i],
            ),
        )
        self.engine_ids = [ids[i] for i in order]
        idents = [idents[i] for i in order]
        hosts = [d["host"] for d in idents]
        master_host = hosts[0]
        one_host = all(h == master_host for h in hosts)
        # rank 0's address on the route to this notebook: the other hosts reach it the same way
        master_addr = "127.0.0.1" if one_host else idents[0]["addr"]
        if one_host and master_host == here:
            master_port = network.free_port()  # rank 0 is on this host: no round trip to ask it
        else:
            master_port = self.client[self.engine_ids[0]].apply_sync(rpc.handle, rpc.FreePort())
        remote_launch = cfg.remote_launch()
        # Slurm/SSH: each rank pins from the GPUs its own host (and Slurm) makes visible to it
        backend, gpu_ids = cfg.backend, []
        if not remote_launch and cfg.framework == "torch":
            plan = plan_gpus(cfg.backend, cfg.n, launchers.gpu_ids() if cfg.backend != "gloo" else [])
            backend, gpu_ids = plan.backend, list(plan.gpu_ids)
        stack_dir = os.path.join(self.state_dir(), "stacks")
        controller = self._controller_pids()
        if cfg.framework == "torch" and one_host and master_host == here and cfg.n >= LARGE_LOCAL_FROM:
            os.makedirs(self.state_dir(), exist_ok=True)
            self.store_file = os.path.join(self.state_dir(), f"store-{master_port}")
            if os.path.exists(self.store_file):
                os.remove(self.store_file)  # a file store must start empty
        per_rank = []
        for rank in range(len(self.engine_ids)):
            same_host = [r for r, h in enumerate(hosts) if h == hosts[rank]]
            launcher_local = idents[rank].get("launcher_local_rank")
            request = rpc.Bootstrap(
                rank=rank,
                world_size=cfg.n,
                local_rank=launcher_local if launcher_local is not None else same_host.index(rank),
                local_world_size=len(same_host),
                master_addr=master_addr,
                master_port=master_port,
                backend=backend,
                timeout_s=cfg.timeout,
                threads=cfg.threads_per_rank(),
                gpu_ids=tuple(gpu_ids) or None,
                pin_visible_gpu=remote_launch and cfg.backend != "gloo",
                interface_addr=None if one_host else idents[rank]["addr"],
                stack_dir=stack_dir,
                sys_path=(os.getcwd(), *cfg.sys_path),
                # ranks on this host end themselves (rank 0 the controller too) should the
                # notebook process die without stopping them
                parent_pid=os.getpid() if hosts[rank] == here else None,
                also_end=tuple(controller) if rank == 0 and hosts[rank] == here else None,
                framework=cfg.framework,
                extra_env=dict(cfg.nccl_env) or None,
                store_file=self.store_file,
            )
            per_rank.append(request)
        wait_s = max(120, cfg.timeout)
        if len(self.engine_ids) >= self.fanout_from:  # one request down the broadcast tree
            table = dict(zip(self.engine_ids, per_rank))
            self.info = self.apply(rpc.handle, rpc.BootstrapEach(table), timeout=wait_s)
        else:
            pending = [self.client[e].apply_async(rpc.handle, req) for e, req in zip(self.engine_ids, per_rank)]
            self.info = [ar.get(timeout=wait_s) for ar in pending]
        idents = [{**d, "host": i["host"], "pid": i["pid"]} for d, i in zip(idents, self.info)]
        lprocs = self._launcher_procs()
        self.procs = [
            health.RankProcess(r, d["host"], d["pid"], lprocs.get(d["pid"]), exit_dir=self.exit_dir)
            for r, d in enumerate(idents)
        ]
        local_pids = [p.pid for p in self.procs if p.local]
        self.started_pids = sorted(set(self.started_pids) | set(health.process_tree(local_pids)))
        self.watcher = health.Watcher(self.procs)
        if self.lifeline is not None:  # engines that ended while the set was coming up
            for (host, pid), code in list(self.lifeline.exits.items()):
                self._guard_exit(host, pid, code)
            for host, silent in list(self.lifeline.lost.items()):
                self._host_lost(host, silent)

    # ------------------------------------------------------------- properties
    @property
    def world_size(self) -> int:
        return len(self.engine_ids)

    @property
    def running(self) -> bool:
        return not self.stopped and self.client is not None

    def state_dir(self) -> str:
        """Where this rank set keeps its files (the ipyparallel profile's folder)."""
        base = getattr(self.cluster, "profile_dir", None) or os.getcwd()
        cid = getattr(self.cluster, "cluster_id", "") or "default"
        return os.path.join(base, "workbench", cid)

    def owner_file(self) -> str:
        """Names the process the controller ends with when it is not the notebook (detach)."""
        return os.path.join(self.state_dir(), "owner")

    def require_running(self) -> None:
        if not self.running:
            raise NotRunning("no ranks are running: start them with `%distrain start -n 2`")

    def dead(self) -> list[dict]:
        """Deaths detected so far (rank, host, pid, exit), in rank order."""
        if self.watcher is None:
            return []
        deaths = self.watcher.known()
        if self.client is not None:
            live = set(self.client.ids)
            for rank, eid in enumerate(self.engine_ids):
                # a local rank is dead when its pid is gone (the watcher); one the
                # controller dropped while its process lives is stuck, not dead
                if eid not in live and rank not in deaths and not self.procs[rank].local:
                    # a guard's report (its exit status) can trail the nanny's word to the controller
                    seen = self._dropped.setdefault((rank, eid), time.monotonic())
                    if self.lifeline is None or time.monotonic() - seen > health.GUARD_REPORT_S:
                        self.watcher.mark_dead(rank, "stopped answering its heartbeat")
            deaths = self.watcher.deaths
        return [deaths[r] for r in sorted(deaths)]

    def view(self, ranks=None):
        """An ipyparallel DirectView on the selected ranks (rank order), cached per selection."""
        self.require_running()
        sel = tuple(self.select(ranks))
        view = self._views.get(sel)
        if view is None:
            view = self._views[sel] = self.client[[self.engine_ids[r] for r in sel]]
        return view

    def fan_view(self, sel: list[int]):
        """A coalescing broadcast view on the selected ranks (rank order), cached per selection."""
        key = tuple(sel)
        view = self._fan_views.get(key)
        if view is None:
            view = self._fan_views[key] = fanout.view(self.client, [self.engine_ids[r] for r in sel])
        return view

    def select(self, ranks) -> list[int]:
        self.require_running()
        if ranks is None:
            return list(range(self.world_size))
        if isinstance(ranks, (list, tuple)) and all(isinstance(r, int) for r in ranks):
            return parse_ranks(",".join(map(str, ranks)), self.world_size)
        return parse_ranks(ranks, self.world_size)

    # -------------------------------------------------------------- running
    def submit(self, fn, *args, ranks=None, **kwargs) -> RankCall:
        """Run ``fn(*args, **kwargs)`` on the ranks without waiting."""
        sel = self.select(ranks)
        fanned = len(sel) >= self.fanout_from
        try:
            if fanned:  # one request and one reply, however many ranks
                ar = fanout.submit(self.fan_view(sel), fn, args, kwargs)
                coalesced = fanout.Coalesced(self.client, ar, [self.engine_ids[r] for r in sel])
            else:
                ar = self.view(sel).apply_async(fn, *args, **kwargs)
        except KeyError:  # the controller has dropped a dead rank's engine: name the rank
            deadline = time.monotonic() + health.GUARD_REPORT_S + 0.2
            while not (deaths := [d for d in self.dead() if d["rank"] in sel]) and time.monotonic() < deadline:
                time.sleep(0.05)
            if deaths:
                raise RankDied(health.death_message(deaths), deaths) from None
            raise
        call = RankCall(self, sel, ar, fanned=coalesced if fanned else None)
        if fanned:
            calls = [ref for ref in self._fanned_calls if ref() is not None]
            self._fanned_calls = calls if any(_in_flight(ref()) for ref in calls) else []
            self._fanned_calls.append(weakref.ref(call))
        return call

    def _queues(self) -> dict:
        """The controller's queue lengths per engine. The hub hears of a reply a moment after this
        notebook does: an engine still counted busy with nothing of this notebook's outstanding on
        it is asked about once more (another client's call stays busy)."""
        queues: dict = {}
        for attempt in range(2):
            if attempt:
                time.sleep(0.05)
            try:
                queues = self.client.queue_status(verbose=False)
            except Exception:
                return {}
            mine = self.client._outstanding_dict
            stale = [
                eid
                for eid, q in queues.items()
                if isinstance(q, dict)
                and (q.get("queue") or q.get("tasks"))
                and not mine.get(self.client._engines.get(eid), ())
            ]
            if not stale:
                break
        return queues

    def _busy_in_fanned_calls(self) -> set[int]:
        """Ranks still running a call sent through the broadcast tree: not yet answered, no
        error from them yet, alive, and not answered on a later call (a rank runs its calls in
        order). A call one of whose ranks died is never answered as a whole."""
        busy: set[int] = set()
        answered_later: set[int] = set()
        for call in reversed([c for c in (ref() for ref in self._fanned_calls) if c is not None]):
            if not _in_flight(call):
                answered_later.update(call.ranks)
                continue
            dead = {d["rank"] for d in call.deaths()}
            busy.update(r for r in call.pending() if r not in dead and r not in answered_later)
        return busy

    def apply(self, fn, *args, ranks=None, timeout: float | None = None, **kwargs) -> list:
        """Run ``fn`` on the ranks; return results in rank order or raise naming the rank."""
        return self.submit(fn, *args, ranks=ranks, **kwargs).result(timeout=timeout)

    def execute_async(self, code, ranks=None, debug=None, output: int | None = output_cut.DEFAULT_LIMIT) -> RankCall:
        """Run a code string on the ranks (as a cell) without waiting; or a request of ``rpc``
        whose output is then shown as a cell's (``run_cell``: ``rpc.Prepare``).

        Sent as an apply of ``rpc.RunCell`` (lighter than an execute request on both
        ends, same output), top-level ``await`` included (``cell_runner.run_awaiting``).
        ``debug``: the cell's ``shared.debug_wire.CellDebug`` (see ``notebook.debugger``).
        ``output``: about the most characters the cell's printed output brings back, all ranks
        together (None: all of it); every line is in the ranks' log files either way.
        """
        if isinstance(code, str):
            limit = None if output is None else output_cut.per_stream(output, len(self.select(ranks)))
            request = rpc.RunCell(code, debug, limit)
            self.last_cell = code  # a stack's line in it is "cell line N" (``culprit``)
        else:
            request = code
        call = self.submit(rpc.handle, request, ranks=ranks)
        call.cell = getattr(request, "AS_CELL", False)  # its error is an output message, not a raise
        return call

    def execute(self, code: str, ranks=None, timeout: float | None = None) -> RankCall:
        """Run a code string on the ranks and wait; raises on a failure (naming ranks)."""
        call = self.execute_async(code, ranks)
        call.result(timeout=timeout)
        return call

    def push(self, namespace: dict, ranks=None) -> None:
        """Set variables in the ranks' namespaces."""
        sel = self.select(ranks)
        if len(sel) >= self.fanout_from:  # the values travel once, to the tree, not once per rank
            self.apply(rpc.handle, rpc.SetNames.of(namespace), ranks=sel)
            return
        self.view(sel).push(namespace, block=True)

    def pull(self, name: str, ranks=None) -> list:
        """Fetch a variable from the ranks, in rank order."""
        sel = self.select(ranks)
        if len(sel) >= self.fanout_from:
            return self.apply(rpc.handle, rpc.GetName(name), ranks=sel)
        ar = self.view(sel).pull(name, block=False)
        return RankCall(self, sel, ar).result()

    def interrupt(self, ranks=None) -> None:
        """Send SIGINT to the ranks (what Ctrl-C / the stop button does to a cell)."""
        sel = self.select(ranks)
        live = set(self.client.ids)
        targets = []
        for r in sel:
            proc = self.procs[r] if r < len(self.procs) else None
            if proc is not None and proc.local:
                # by pid: local engines run without ipyparallel's nanny (launchers.py)
                try:
                    os.kill(proc.pid, signal.SIGINT)
                except ProcessLookupError:
                    pass
            elif self.engine_ids[r] in live:
                targets.append(self.engine_ids[r])
        if targets:
            self.client.send_signal(signal.SIGINT, targets=targets, block=True)

    def signal_rank(self, rank: int, sig: int) -> None:
        """Send a signal to one rank's process (for fault drills and diagnosis)."""
        proc = self.procs[rank]
        if proc.local:
            os.kill(proc.pid, sig)
        else:
            self.client.send_signal(sig, targets=[self.engine_ids[rank]], block=True)

    # --------------------------------------------------------------- status
    def status(self) -> list[dict]:
        """Rank, host, pid, device, memory and state (idle/busy/dead/stopped) per rank.

        Asks the controller for queue lengths rather than the ranks themselves, so
        that a busy or stuck rank does not make status hang.
        """
        self.require_running()
        deaths = {d["rank"]: d for d in self.dead()}
        queues = self._queues()
        fanned_busy = self._busy_in_fanned_calls()
        rows = []
        for rank, eid in enumerate(self.engine_ids):
            info = self.info[rank] if rank < len(self.info) else {}
            proc = self.procs[rank] if rank < len(self.procs) else None
            if rank in deaths:
                state = "dead"
            elif proc is not None and proc.state() == "stopped":
                state = "stopped"
            else:
                q = queues.get(eid, {}) if isinstance(queues, dict) else {}
                state = "busy" if (q.get("queue", 0) or q.get("tasks", 0) or rank in fanned_busy) else "idle"
            rss = proc.rss() if proc is not None and rank not in deaths else None
            rows.append(
                {
                    "rank": rank,
                    "host": info.get("host", proc.host if proc else "?"),
                    "pid": info.get("pid", proc.pid if proc else None),
                    "device": info.get("device", "?"),
                    "backend": info.get("backend", "?"),
                    "memory_mb": round(rss / 2**20, 1) if rss else None,
                    "state": state,
                    "exit": deaths[rank]["exit"] if rank in deaths else "",
                    **({"nccl": info["nccl"]} if info.get("nccl") else {}),  # NCCL ranks: version and NCCL_* env
                    **({"framework": info["framework"]} if info.get("framework", "torch") != "torch" else {}),
                    **({"ray_node": self.launcher.node_of(rank)} if self.launcher is not None else {}),
                }
            )
        return rows

    # ----------------------------------------------------------------- stop
    def stop(self) -> list[int]:
        """Stop the engines and the controller; end by pid whatever is left.

        Returns the pids still alive afterwards (empty when all went well).
        """
        if self.watcher is not None:
            self.watcher.close()
        if self._controller_session is None and self.cluster is not None:
            self._note_controller()  # a start interrupted while the controller came up
        pids = sorted(set(self.started_pids) | set(health.process_tree(self.started_pids)))
        if self.client is not None:
            try:
                self.client.close()
            except Exception:
                pass
        # Ranks (and their nannies) first, by pid: their state is being thrown away, and a
        # busy or stuck rank would make ipyparallel wait 5 s per engine. Then ipyparallel
        # stops the controller and tidies its files.
        controller = set(self._controller_pids())
        health.end_pids([p for p in pids if p not in controller], grace=0.2)
        if self.lifeline is not None:
            # the guards on other hosts see their notebook end go and end their ranks
            self.lifeline.close()
        if self.job_id:
            slurm.cancel(self.job_id)
        if self.cluster is not None:
            self._forget_ssh_engines()
            try:
                self.cluster.stop_cluster_sync()
            except Exception:
                pass
        if self.job_id:
            slurm.wait_until_gone(self.job_id)
        if self.launcher is not None:
            self.launcher.stop()  # the actors and the placement group; their guards ended the ranks
        self.stopped = True
        if self.forked is not None:
            self.forked.close()
        for fork in [*self.replacements, *([self.spare] if self.spare is not None else [])]:
            fork.close()
        if self.lighthouse is not None:
            self.lighthouse.stop()
        left = health.end_pids(pids, grace=1.0)
        if self.store_file is not None and os.path.exists(self.store_file):
            os.remove(self.store_file)
        # A controller stopped within a second of its start may be ended before it has set
        # its signal handlers, while it forks its schedulers: those it forked after the scan
        # above outlive it (at ppid 1). They are still in its session: end them by pid, with
        # no grace (the controller they served is gone).
        if self._controller_session is not None:
            left += health.end_pids(health.session_pids(*self._controller_session), grace=0.1)
        return sorted(set(left))

    def _forget_ssh_engines(self) -> None:
        """SSH engine sets: their guards have ended them; ipyparallel's stop would ssh to
        each host to signal and wait for them (seconds each, and errors once a host is gone)."""
        for esid, es in list((self.cluster.engines or {}).items()):
            if not _is_ssh(es):
                continue
            for launcher in (getattr(es, "launchers", None) or {}).values():
                waiting = getattr(launcher, "_stop_waiting", None)
                if waiting is not None:
                    waiting.set()
            self.cluster.engines.pop(esid, None)

    def allocation(self) -> str:
        """Where the ranks run: the Slurm job and its nodes, or the hosts; '' for one host."""
        if self.launcher is not None:
            return self.launcher.allocation()
        if self.job_id:
            return f"Slurm job {self.job_id} on {', '.join(self.nodes) or '(no nodes yet)'}"
        hosts = sorted({d.get("host") for d in self.info if d.get("host")})
        return f"hosts {', '.join(hosts)}" if len(hosts) > 1 else ""

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "running"
        return f"<RankSet {self.world_size} ranks, {self.config.launcher}, {state}>"
