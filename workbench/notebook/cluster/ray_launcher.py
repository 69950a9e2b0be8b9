"""Ranks placed by a Ray cluster: ``%distrain start -n 4 --launcher ray``.

The notebook joins the Ray cluster as a driver, reserves one bundle per rank in a placement
group (gang scheduling: all ranks or none) and places one
:class:`workbench.engine.ray_actor.RankHost` actor in each, which starts the same guarded rank
process as the Slurm and SSH launchers. The actors belong to this driver, so Ray ends them when
the notebook process dies. What a user sees (queued, deaths, stop): docs/ray.md. Imports ``ray``
only when used: it is an optional extra (``pip install 'workbench[ray]'``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass

from ...shared.errors import Interrupted
from . import network, ssh
from .launchers import JobState

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
HOW_TO_START = (
    "start one with `ray start --head --port 6379` on a machine the ranks' hosts reach (and "
    "`ray start --address HEAD:6379` on each other node), then pass --address HEAD:6379 or set "
    "RAY_ADDRESS; on Kubernetes, a KubeRay RayCluster's head service is the address"
)


PYTHON = "{python}"  # in a rank's command: the Python of the Ray worker that starts it


class RayError(RuntimeError):
    """No Ray cluster at the address, Ray not installed, or the actors could not be placed."""


@dataclass(frozen=True, kw_only=True)
class RayRequest:
    """What ``%distrain start --launcher ray`` asks of Ray for each rank."""

    address: str | None = None  # default: RAY_ADDRESS, else "auto"
    cpus_per_rank: float | None = None  # default 1
    gpus_per_rank: float | None = None  # default 0
    strategy: str = "PACK"

    def validate(self) -> None:
        for name in ("cpus_per_rank", "gpus_per_rank"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a number >= 0, got {value!r}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"placement strategy {self.strategy!r} is not known: use one of {', '.join(STRATEGIES)}")

    def bundle(self) -> dict[str, float]:
        out = {"CPU": float(1 if self.cpus_per_rank is None else self.cpus_per_rank)}
        if self.gpus_per_rank:
            out["GPU"] = float(self.gpus_per_rank)
        return out

    def resolved_address(self) -> str:
        return self.address or os.environ.get("RAY_ADDRESS") or "auto"


def death_cause(exc: BaseException) -> str:
    """Ray's own sentence on why an actor died (first lines of its message, no stack)."""
    text = str(exc)
    at = text.find("The actor is dead because")
    if at < 0:
        at = text.find("The actor died")
    cause = (text[at:] if at >= 0 else text).strip().splitlines()[0] if text.strip() else type(exc).__name__
    # Ray follows the cause with a paragraph of generic troubleshooting: keep the first sentence or two
    cut = cause.find(" Some common causes")
    return cause[:cut] if cut > 0 else cause[:400]


def _check_reachable(address: str) -> None:
    """A HOST:PORT with nothing listening fails at once (Ray's driver would retry for a minute)."""
    import socket

    host, sep, port = address.replace("ray://", "").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as exc:
        raise RayError(f"no Ray cluster at {address} ({exc.strerror or exc}): {HOW_TO_START}") from None


class RayLauncher:
    """The ranks' placement group and actors in one Ray cluster, for one rank set."""

    name = "ray"

    def __init__(self, request: RayRequest, n: int):
        self.request = request
        self.n = n
        self.address = request.resolved_address()
        self.owned_connection = False  # this launcher called ray.init (so it shuts it down)
        self.pg = None
        self.actors: list = []
        self.places: list[dict] = []  # per bundle: host, actor_pid, guard_pid, node_id, node_ip
        self._waits: dict = {}  # ObjectRef of actor.wait() -> bundle index
        self.ended: dict[int, dict] = {}  # bundle -> how its rank process ended (code, output, log)
        self._queue: JobState | None = None
        self._closed = threading.Event()
        self._monitor: threading.Thread | None = None

    # ------------------------------------------------------------ the cluster
    def connect(self) -> None:
        try:
            import ray
        except ImportError:
            raise RayError(
                "--launcher ray needs Ray in the notebook's environment: pip install 'workbench[ray]' "
                "(the same Ray version as the cluster's)"
            ) from None
        if ray.is_initialized():
            return  # the user's own connection: used, and left open at stop
        _check_reachable(self.address)
        try:
            ray.init(
                address=self.address,
                log_to_driver=False,
                configure_logging=False,
                include_dashboard=False,
            )
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RayError(f"no Ray cluster at {self.address} ({str(exc).splitlines()[0]}): {HOW_TO_START}") from None
        self.owned_connection = True

    def node_addresses(self) -> list[str]:
        import ray

        return sorted({n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")})

    def listen_address(self, ip: str | None) -> str:
        """The notebook's address toward the Ray nodes (loopback when every node is this host)."""
        here = set(network.local_addresses())
        remote = [a for a in self.node_addresses() if a not in here and not network.is_loopback(a)]
        if not remote and not ip:
            # every node on this host: its own address, so that a node joining later still reaches it
            return "127.0.0.1"
        return network.listen_address(ip, remote)

    # ---------------------------------------------------------- the placement
    def reserve(self, progress, on_queue, cancelled: threading.Event) -> None:
        """A placement group of one bundle per rank, ready (all placed) or cancelled."""
        import ray
        from ray.util.placement_group import placement_group

        self.pg = placement_group([self.request.bundle() for _ in range(self.n)], strategy=self.request.strategy)
        ready = self.pg.ready()
        shown = None
        while True:
            done, _ = ray.wait([ready], timeout=0.25)
            if done:
                try:
                    ray.get(ready)
                except Exception as exc:  # removed while waiting (cancelled)
                    if cancelled.is_set():
                        break
                    raise RayError(f"Ray placement group {self._pg_id()} failed: {death_cause(exc)}") from None
                if self._queue is not None:
                    self._queue = JobState(self._queue.job_id, "RUNNING", "", tuple(self._nodes_of_pg()))
                    progress(f"placement group {self._pg_id()} placed on {', '.join(self._queue.nodes)}")
                    on_queue(self._queue)
                return
            if cancelled.is_set():
                break
            js = self._pending_state()
            line = f"queued: Ray placement group {js.job_id} {js.state} ({js.reason})"
            if line != shown:
                self._queue = js
                progress(line)
                on_queue(js)
                shown = line
        raise Interrupted(f"start cancelled: Ray placement group {self._pg_id()} removed while {shown or 'queued'}")

    def _pg_id(self) -> str:
        return self.pg.id.hex()[:12] if self.pg is not None else "-"

    def _pending_state(self) -> JobState:
        from ray.util.placement_group import placement_group_table

        table = placement_group_table(self.pg)
        reason = (table.get("stats") or {}).get("scheduling_state") or "waiting"
        bundle = ", ".join(f"{k}={v:g}" for k, v in self.request.bundle().items())
        return JobState(self._pg_id(), table.get("state", "PENDING"), f"{reason}: {self.n} x {{{bundle}}}", ())

    def _nodes_of_pg(self) -> list[str]:
        import ray
        from ray.util.placement_group import placement_group_table

        ids = set((placement_group_table(self.pg).get("bundles_to_node_id") or {}).values())
        return sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] in ids)

    def queued(self) -> JobState | None:
        """The placement group while it waits for resources (None once placed, or before)."""
        return self._queue if self._queue is not None and self._queue.state == "PENDING" else None

    def place(self, cmd: list[str], envs: list[dict], runtime_env: dict | None, timeout: float = 120.0) -> None:
        """One actor per bundle, each starting ``cmd`` with its ``envs[i]``; where they landed."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        # a launch, not a call: like srun or ssh it starts the guarded engine, reached through rpc once registered
        from ...engine.ray_actor import RankHost

        bundle = self.request.bundle()
        actor_cls = ray.remote(RankHost)
        for i in range(self.n):
            strategy = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i)
            opts = dict(
                num_cpus=bundle["CPU"],
                num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=strategy,
                max_concurrency=4,  # wait() blocks while where()/end() answer
                max_restarts=0,
                name=None,
            )
            if runtime_env:
                opts["runtime_env"] = runtime_env
            self.actors.append(actor_cls.options(**opts).remote(cmd, envs[i]))
        try:
            self.places = ray.get([a.where.remote() for a in self.actors], timeout=timeout)
        except Exception as exc:
            raise RayError(f"the ranks' Ray actors did not start: {death_cause(exc)}") from None
        self._waits = {a.wait.remote(): i for i, a in enumerate(self.actors)}

    def watch(self, on_death) -> None:
        """Call ``on_death(bundle, cause)`` when an actor dies (not when its rank merely exits)."""
        import ray

        def run() -> None:
            while not self._closed.is_set() and self._waits:
                done, _ = ray.wait(list(self._waits), num_returns=1, timeout=0.5)
                for ref in done:
                    i = self._waits.pop(ref)
                    try:
                        self.ended[i] = ray.get(ref)  # the rank process ended; its guard has said how
                    except Exception as exc:
                        self.ended[i] = {"code": None, "output": "", "cause": death_cause(exc)}
                        if not self._closed.is_set():
                            on_death(i, self.ended[i]["cause"])

        self._monitor = threading.Thread(target=run, name="workbench-ray-watch", daemon=True)
        self._monitor.start()

    def check_registering(self) -> None:
        """While the engines register: a rank process that already ended fails the start, with its output."""
        for i, how in sorted(self.ended.items()):
            host = self.places[i]["host"] if i < len(self.places) else "?"
            why = how.get("cause") or f"exit {how.get('code')}"
            raise RayError(
                f"rank {i} (Ray node {self.node_of(i)}, host {host}) ended before it registered ({why}); "
                f"its output ({how.get('log', 'in the Ray worker log')}):\n{how.get('output', '')}"
            )

    # ---------------------------------------------------------------- answers
    def node_of(self, bundle: int) -> str:
        place = self.places[bundle] if bundle < len(self.places) else {}
        return (place.get("node_id") or "")[:12]

    def pids(self) -> dict[str, list[int]]:
        """host -> the actors' and guards' pids there (the engines' come from the ranks)."""
        out: dict[str, list[int]] = {}
        for p in self.places:
            out.setdefault(p["host"], []).extend([p["actor_pid"], p["guard_pid"]])
        return out

    def allocation(self) -> str:
        nodes = sorted({p["node_ip"] for p in self.places})
        return f"Ray cluster {self.address}, placement group {self._pg_id()} on {', '.join(nodes) or '(not placed)'}"

    # ------------------------------------------------------------------- end
    def cancel(self) -> None:
        """Give up a placement group that waits (the start then ends, nothing left)."""
        self._remove_pg()

    def stop(self, wait: float = 10.0) -> None:
        """Kill the actors and remove the placement group made here; disconnect if we connected."""
        self._closed.set()
        try:
            import ray
        except ImportError:
            return
        if not ray.is_initialized():
            return
        for a in self.actors:
            try:
                ray.kill(a, no_restart=True)
            except Exception:
                pass
        self._remove_pg()
        if self._monitor is not None:
            self._monitor.join(2.0)
        self._wait_actors_gone(wait)
        if self.owned_connection:
            ray.shutdown()
            self.owned_connection = False

    def _remove_pg(self) -> None:
        if self.pg is None:
            return
        try:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.pg)
        except Exception:
            pass

    def _wait_actors_gone(self, wait: float) -> None:
        """Until Ray reports the actors dead (their processes ended), at most ``wait`` s."""
        import ray

        deadline = time.monotonic() + wait
        refs = [a.where.remote() for a in self.actors]
        while refs and time.monotonic() < deadline:
            left = []
            for ref in refs:
                try:
                    ray.get(ref, timeout=0.5)
                    left.append(ref)  # still answering: asked again below
                except ray.exceptions.GetTimeoutError:
                    left.append(ref)
                except Exception:
                    pass  # dead
            if not left:
                return
            refs = [a.where.remote() for a, r in zip(self.actors, refs) if r in left]
            time.sleep(0.1)


def engine_connection(cluster, timeout: float = 120.0) -> dict:
    """The controller's engine connection info (what ipyparallel hands its launchers),
    once the controller has written it."""
    path = os.path.join(cluster.profile_dir, "security", f"ipcontroller-{cluster.cluster_id}-engine.json")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):  # not there yet, or half written
            if time.monotonic() > deadline:
                raise RayError(f"the controller wrote no connection file ({path}) within {timeout:.0f} s") from None
            time.sleep(0.05)


def start(rs) -> None:
    """Start ``rs``'s ranks through Ray (``RankSet.start`` calls this for ``--launcher ray``)."""
    from . import launchers

    cfg = rs.config
    launcher: RayLauncher = rs.launcher
    launcher.connect()
    rs.listen_ip = launcher.listen_address(cfg.ip)
    # resources first: no controller or lifeline while the placement group waits in Ray's queue
    launcher.reserve(rs.progress, rs._queue_changed, rs._cancel)
    kwargs = launchers.start_guarded_controller(rs)
    info = json.dumps(engine_connection(rs.cluster))
    remote_dir = os.path.join(rs.cluster.profile_dir, "remote", "ray")
    envs = []
    for i in range(cfg.n):
        env = ssh.remote_env(cfg.python, rs.lifeline.env(), i)  # slot i: rank i is bundle i
        env.update(IPP_CONNECTION_INFO=info, IPP_CLUSTER_ID=rs.cluster.cluster_id, IPP_PROFILE_DIR=remote_dir)
        envs.append({k: str(v) for k, v in env.items()})
    # "{python}": each node's own interpreter (the actor's), unless --python names one
    python = cfg.python or PYTHON
    cmd = ssh.engine_cmd(python) + [
        *kwargs["config"].EngineLauncher.engine_args,
        f"--profile-dir={remote_dir}",
        f"--cluster-id={rs.cluster.cluster_id}",
    ]
    # the actors import workbench: with no --python, this notebook's import path goes with them
    path = os.environ.get("PYTHONPATH") if cfg.python is None else None
    launcher.place(cmd, envs, {"env_vars": {"PYTHONPATH": path}} if path else None)
    launcher.watch(rs._actor_died)
    rs.client = rs._connect_client()
    rs._await_engines(time.monotonic() + rs._register_s(), sorted({p["host"] for p in launcher.places}))
