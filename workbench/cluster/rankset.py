"""A set of persistent rank processes on ipyparallel engines (notebook side).

:class:`RankSet` starts N engines through one of ipyparallel's launchers, gives
them stable ranks 0..N-1, bootstraps ``torch.distributed`` on each, runs code and
functions on all or some of them, and stops exactly the processes it started.
It never imports torch in the notebook process.
"""
from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass, field

from .. import background
from . import health, launchers
from .errors import NotRunning, RankDied, RankFailure
from .ranges import parse_ranks

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

    def validate(self) -> None:
        """Refuse bad settings before any process is started."""
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"-n must be a whole number of ranks >= 1, got {self.n!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend {self.backend!r} is not known: use one of {', '.join(BACKENDS)}")
        if self.launcher not in launchers.LAUNCHERS:
            raise ValueError(
                f"--launcher {self.launcher!r} is not known: use one of {', '.join(launchers.LAUNCHERS)}"
            )
        if not self.timeout or self.timeout <= 0:
            raise ValueError(f"--timeout must be a positive number of seconds, got {self.timeout!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads!r}")

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
        self.procs: list[health.RankProcess] = []
        self.watcher: health.Watcher | None = None
        self.started_pids: list[int] = []
        self.stopped = False
        self.start_seconds: float | None = None
        self._views: dict[tuple[int, ...], object] = {}

    # ------------------------------------------------------------------ start
    @classmethod
    def start(cls, config: RankSetConfig | None = None, **kwargs) -> "RankSet":
        """Start engines, assign ranks and initialise the process group on every rank."""
        config = config or RankSetConfig(**kwargs)
        self = cls(config)
        t0 = time.perf_counter()
        try:
            self._launch()
            self._bootstrap()
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - t0
        return self

    def _launch(self) -> None:
        import ipyparallel as ipp

        cfg = self.config
        kwargs = launchers.cluster_kwargs(cfg.launcher, cfg.n, options=cfg.launcher_options)
        if cfg.profile_dir:
            kwargs["profile_dir"] = cfg.profile_dir
        self.cluster = ipp.Cluster(**kwargs)
        self.cluster.start_controller_sync()
        self.started_pids.extend(self._controller_pids())
        self.cluster.start_engines_sync()
        self.started_pids.extend(self._launcher_pids())
        self.client = self.cluster.connect_client_sync()
        self.client.wait_for_engines(cfg.n, timeout=max(60, 10 * cfg.n), block=True, interactive=False)
        # registered: from now on the controller only routes, and gives way to the ranks
        background.lower_processes(self._controller_pids())

    def _controller_pids(self) -> list[int]:
        ctl = getattr(self.cluster, "controller", None)
        pid = getattr(ctl, "pid", None) or getattr(getattr(ctl, "process", None), "pid", None)
        return health.process_tree([pid]) if pid else []

    def _launcher_pids(self) -> list[int]:
        pids = []
        for es in (self.cluster.engines or {}).values():
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
        from ..engine import runtime

        cfg = self.config
        ids = sorted(self.client.ids)[: cfg.n]
        idents = self.client[ids].apply_async(runtime.identity).get(timeout=60)
        order = sorted(
            range(len(ids)),
            key=lambda i: (idents[i]["launcher_rank"] if idents[i]["launcher_rank"] is not None else ids[i]),
        )
        self.engine_ids = [ids[i] for i in order]
        idents = [idents[i] for i in order]
        hosts = [d["host"] for d in idents]
        master_host = hosts[0]
        master_addr = "127.0.0.1" if all(h == master_host for h in hosts) else master_host
        master_port = self.client[self.engine_ids[0]].apply_sync(runtime.free_port)
        gpu_ids = launchers.gpu_ids() if cfg.backend != "gloo" else []
        if cfg.backend == "nccl" and not gpu_ids:
            raise ValueError("--backend nccl needs GPUs and none are visible: use --backend gloo (CPU ranks)")
        stack_dir = os.path.join(self.state_dir(), "stacks")
        controller = self._controller_pids()
        pending = []
        for rank, eid in enumerate(self.engine_ids):
            same_host = [r for r, h in enumerate(hosts) if h == hosts[rank]]
            kwargs = dict(
                rank=rank,
                world_size=cfg.n,
                local_rank=same_host.index(rank),
                local_world_size=len(same_host),
                master_addr=master_addr,
                master_port=master_port,
                backend=cfg.backend,
                timeout_s=cfg.timeout,
                threads=cfg.threads_per_rank(),
                gpu_ids=gpu_ids or None,
                stack_dir=stack_dir,
                sys_path=[os.getcwd(), *cfg.sys_path],
                # ranks on this host end themselves (rank 0 the controller too) should the
                # notebook process die without stopping them
                parent_pid=os.getpid() if hosts[rank] == socket.gethostname() else None,
                also_end=controller if rank == 0 and hosts[rank] == socket.gethostname() else None,
            )
            pending.append(self.client[eid].apply_async(runtime.bootstrap, **kwargs))
        self.info = [ar.get(timeout=max(120, cfg.timeout)) for ar in pending]
        lprocs = self._launcher_procs()
        self.procs = [
            health.RankProcess(r, d["host"], d["pid"], lprocs.get(d["pid"])) for r, d in enumerate(idents)
        ]
        local_pids = [p.pid for p in self.procs if p.local]
        self.started_pids = sorted(set(self.started_pids) | set(health.process_tree(local_pids)))
        self.watcher = health.Watcher(self.procs)

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

    def require_running(self) -> None:
        if not self.running:
            raise NotRunning("no ranks are running: start them with `%distrain start -n 2`")

    def dead(self) -> list[dict]:
        """Deaths detected so far (rank, host, pid, exit), in rank order."""
        if self.watcher is None:
            return []
        deaths = self.watcher.poll()
        if self.client is not None:
            live = set(self.client.ids)
            for rank, eid in enumerate(self.engine_ids):
                # a local rank is dead when its pid is gone (the watcher); one the
                # controller dropped while its process lives is stuck, not dead
                if eid not in live and rank not in deaths and not self.procs[rank].local:
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

    def select(self, ranks) -> list[int]:
        self.require_running()
        if ranks is None:
            return list(range(self.world_size))
        if isinstance(ranks, (list, tuple)) and all(isinstance(r, int) for r in ranks):
            return parse_ranks(",".join(map(str, ranks)), self.world_size)
        return parse_ranks(ranks, self.world_size)

    # -------------------------------------------------------------- running
    def submit(self, fn, *args, ranks=None, **kwargs) -> "RankCall":
        """Run ``fn(*args, **kwargs)`` on the ranks without waiting."""
        sel = self.select(ranks)
        ar = self.view(sel).apply_async(fn, *args, **kwargs)
        return RankCall(self, sel, ar)

    def apply(self, fn, *args, ranks=None, timeout: float | None = None, **kwargs) -> list:
        """Run ``fn`` on the ranks; return results in rank order or raise naming the rank."""
        return self.submit(fn, *args, ranks=ranks, **kwargs).result(timeout=timeout)

    def execute_async(self, code: str, ranks=None) -> "RankCall":
        """Run a code string on the ranks (as a cell) without waiting."""
        sel = self.select(ranks)
        ar = self.view(sel).execute(code, silent=False, block=False)
        return RankCall(self, sel, ar)

    def execute(self, code: str, ranks=None, timeout: float | None = None) -> "RankCall":
        """Run a code string on the ranks and wait; raises on a failure (naming ranks)."""
        call = self.execute_async(code, ranks)
        call.result(timeout=timeout)
        return call

    def push(self, namespace: dict, ranks=None) -> None:
        """Set variables in the ranks' namespaces."""
        self.view(ranks).push(namespace, block=True)

    def pull(self, name: str, ranks=None) -> list:
        """Fetch a variable from the ranks, in rank order."""
        sel = self.select(ranks)
        ar = self.view(sel).pull(name, block=False)
        return RankCall(self, sel, ar).result()

    def interrupt(self, ranks=None) -> None:
        """Send SIGINT to the ranks (what Ctrl-C / the stop button does to a cell)."""
        sel = self.select(ranks)
        live = set(self.client.ids)
        targets = [self.engine_ids[r] for r in sel if self.engine_ids[r] in live]
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
        try:
            queues = self.client.queue_status(verbose=False)
        except Exception:
            queues = {}
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
                state = "busy" if (q.get("queue", 0) or q.get("tasks", 0)) else "idle"
            rss = proc.rss() if proc is not None and rank not in deaths else None
            rows.append({
                "rank": rank,
                "host": info.get("host", proc.host if proc else "?"),
                "pid": info.get("pid", proc.pid if proc else None),
                "device": info.get("device", "?"),
                "backend": info.get("backend", "?"),
                "memory_mb": round(rss / 2**20, 1) if rss else None,
                "state": state,
                "exit": deaths[rank]["exit"] if rank in deaths else "",
            })
        return rows

    # ----------------------------------------------------------------- stop
    def stop(self) -> list[int]:
        """Stop the engines and the controller; end by pid whatever is left.

        Returns the pids still alive afterwards (empty when all went well).
        """
        if self.watcher is not None:
            self.watcher.close()
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
        if self.cluster is not None:
            try:
                self.cluster.stop_cluster_sync()
            except Exception:
                pass
        self.stopped = True
        return health.end_pids(pids, grace=1.0)

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "running"
        return f"<RankSet {self.world_size} ranks, {self.config.launcher}, {state}>"


class RankCall:
    """A call in flight on some ranks. ``result()`` waits, watching for dead ranks."""

    def __init__(self, rankset: RankSet, ranks: list[int], ar):
        self.rankset = rankset
        self.ranks = ranks
        self.ar = ar

    def wait(self, timeout: float | None = None, poll: float = 0.1) -> bool:
        """Wait until done, ``timeout`` passes or a rank dies; True when done.

        After a death the wait ends within half a second (the survivors that notice
        the dead peer at once get that long to report); survivors that are blocked
        in a collective with no direct link to it come out at the collective timeout.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            if self.ar.wait(step):
                return True
            if self.deaths():
                grace = min(self.rankset.config.timeout, 0.4)
                self.ar.wait(grace)
                return self.ar.ready()
            if deadline is not None and time.monotonic() >= deadline:
                return False

    def deaths(self) -> list[dict]:
        return [d for d in self.rankset.dead() if d["rank"] in self.ranks]

    def result(self, timeout: float | None = None) -> list:
        """Per-rank results in rank order; raises RankDied / RankFailure / TimeoutError."""
        done = self.wait(timeout)
        deaths = [] if done and self.ar.successful() else self.deaths()
        if deaths:
            raise RankDied(health.death_message(deaths), deaths)
        if not done:
            raise TimeoutError(f"ranks {self.pending()} still running after {timeout} s")
        failures = self.failures()
        if failures:
            raise RankFailure(failure_message(failures), failures)
        results = self.ar.get()
        return list(results) if isinstance(results, list) else [results]

    def pending(self) -> list[int]:
        return [r for r, m in zip(self.ranks, self.ar._metadata) if not m.get("completed")]

    def failures(self) -> dict[int, tuple[str, str, str]]:
        """rank -> (exception name, message, remote traceback) for ranks that raised."""
        out = {}
        for rank, md in zip(self.ranks, self.ar._metadata):
            err = md.get("error")
            if err is not None:
                out[rank] = (
                    getattr(err, "ename", type(err).__name__),
                    str(getattr(err, "evalue", err)),
                    getattr(err, "traceback", "") or "",
                )
        return out

    def per_rank(self, key: str) -> list:
        """stdout / stderr / outputs / execute_result per rank, in rank order."""
        return [md.get(key) for md in self.ar._metadata]


def failure_message(failures: dict[int, tuple[str, str, str]]) -> str:
    parts = [f"rank {r}: {ename}: {evalue}" for r, (ename, evalue, _) in sorted(failures.items())]
    return "; ".join(parts)
