"""``%distrain start|stop|status|restart|push|pull``: the rank set's life cycle."""

from __future__ import annotations

from ...shared.argtypes import positive_int, rank_selection, seconds
from .. import api, auto_cells, handoff
from ..cluster.launchers import FRAMEWORKS, LAUNCHERS
from ..cluster.rankset import BACKENDS
from . import UsageError, command


def _start_args(p) -> None:
    p.add_argument("-n", type=positive_int, default=None, help="number of ranks (default 2, or the --hosts total)")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: nccl with GPUs, else gloo")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local")
    p.add_argument("--framework", choices=FRAMEWORKS, default="torch", help="jax: the ranks run jax.distributed")
    p.add_argument("--timeout", type=seconds, default=300.0, help="collective timeout in seconds")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads per rank")
    p.add_argument("--nccl", default=None, help="NCCL settings for the ranks, e.g. ALGO=Ring,PROTO=Simple")
    p.add_argument("--nccl-preset", default=None, help="NCCL settings per fabric: ib, roce or nvl72")
    p.add_argument("--auto", action="store_true", help="then run plain cells on the ranks (`%%distrain auto on`)")
    p.add_argument("--ip", default=None, help="slurm/ssh: this host's address the ranks connect to")
    p.add_argument("--hosts", default=None, help="ssh: hostA:2,hostB:2 (ranks per host)")
    p.add_argument("--ssh-config", default=None, help="ssh: an ssh_config file (ssh -F)")
    p.add_argument("--python", default=None, help="slurm/ssh: the ranks' python (default: this one's path)")
    p.add_argument("--nodes", type=positive_int, default=None, help="slurm: number of nodes")
    p.add_argument("--gpus-per-node", type=positive_int, default=None, help="slurm: GPUs per node")
    p.add_argument("--partition", default=None, help="slurm: partition")
    p.add_argument("--time", default=None, help="slurm: time limit (H:MM:SS)")
    p.add_argument("--account", default=None, help="slurm: account")
    p.add_argument("--sbatch", default=None, help='slurm: more sbatch options, e.g. "--constraint=h100"')
    p.add_argument("--address", default=None, help="ray: the cluster (default $RAY_ADDRESS, else auto)")
    p.add_argument("--cpus-per-rank", type=float, default=None, help="ray: CPUs reserved per rank (default 1)")
    p.add_argument("--gpus-per-rank", type=float, default=None, help="ray: GPUs reserved per rank (default 0)")
    p.add_argument(
        "--name",
        default=None,
        help="a named set beside the others (`%%distrain use NAME` switches; default: the current one)",
    )


_SLURM_FLAGS = ("nodes", "gpus_per_node", "partition", "time", "account", "sbatch")


def _slurm_request(args):
    given = {k: getattr(args, k) for k in _SLURM_FLAGS if getattr(args, k) is not None}
    if not given:
        return None
    if args.launcher != "slurm":
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise UsageError(f"{flags} go with --launcher slurm")
    from ..cluster.slurm import SlurmRequest, parse_sbatch

    return SlurmRequest(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        partition=args.partition,
        time=args.time,
        account=args.account,
        sbatch=parse_sbatch(args.sbatch),
    )


def _ray_request(args):
    given = [f for f in ("address", "cpus_per_rank", "gpus_per_rank") if getattr(args, f, None) is not None]
    if not given:
        return None
    if args.launcher != "ray":
        raise UsageError(f"{', '.join('--' + f.replace('_', '-') for f in given)} go with --launcher ray")
    from ..cluster.ray_launcher import RayRequest

    return RayRequest(address=args.address, cpus_per_rank=args.cpus_per_rank, gpus_per_rank=args.gpus_per_rank)


def _rank_count(args) -> int:
    if args.hosts and args.launcher == "ssh":
        from ..cluster.ssh import parse_hosts

        try:
            total = sum(s.n for s in parse_hosts(args.hosts))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return args.n or total
    return args.n or 2


@command("start", "start N ranks and initialise their process group", _start_args)
def _start(args, shell):
    try:
        rs = api.start(
            _rank_count(args),
            backend=args.backend,
            launcher=args.launcher,
            timeout=args.timeout,
            threads=args.threads,
            ip=args.ip,
            hosts=args.hosts,
            ssh_config=args.ssh_config,
            python=args.python,
            slurm=_slurm_request(args),
            ray=_ray_request(args),
            progress=_live_line(),
            name=args.name,
            framework=args.framework,
            nccl=args.nccl,
            nccl_preset=args.nccl_preset,
        )
    except ValueError as exc:  # bad settings: one line, nothing started
        raise UsageError(str(exc)) from None
    backend = rs.info[0]["backend"] if rs.info else args.backend
    if args.framework != "torch":
        backend = f"{args.framework}, {backend}"
    where = rs.allocation()
    named = f"{args.name!r}: " if args.name else ""
    print(
        f"{named}{rs.world_size} ranks up ({backend}, {args.launcher} launcher{', ' + where if where else ''}) "
        f"in {rs.start_seconds:.1f} s"
    )
    if args.auto:
        auto_cells.turn_on(shell)
        print(AUTO_ON)


def _live_line():
    """Print each progress line as it comes (a queued job's state shows while the cell waits)."""

    def show(line: str) -> None:
        print(line, flush=True)

    return show


AUTO_ON = "auto mode on: plain cells run on the ranks; magics and %%local cells run here"


def _auto_args(p) -> None:
    p.add_argument("state", choices=("on", "off"), help="on: plain cells run on the ranks; off: here")


@command("auto", "run plain cells on the ranks (on) or in the notebook (off)", _auto_args)
def _auto(args, shell):
    if shell is None:
        raise UsageError("`%distrain auto` needs an IPython shell (a notebook or IPython)")
    if args.state == "on":
        api.current()  # refuse before anything changes where no ranks run
        auto_cells.turn_on(shell)
        print(AUTO_ON)
    else:
        was_on = auto_cells.turn_off(shell)
        print("auto mode off: plain cells run in the notebook" if was_on else "auto mode was already off")


def _stop_args(p) -> None:
    p.add_argument(
        "--name",
        default=None,
        help="the named set to stop (default: the current one), or a detached one; the others keep running",
    )


@command("stop", "stop the ranks (every process they started)", _stop_args)
def _stop(args, shell):
    if args.name is not None:
        if args.name not in api.sessions() and args.name in handoff.detached_sets():
            left = handoff.stop(args.name)  # a detached set, from any kernel
            print(
                f"stopped the detached set {args.name!r}; processes still alive: {left}"
                if left
                else f"stopped the detached set {args.name!r} and its keeper"
            )
            return
        if not api.session(args.name).running:  # an unknown name: the error names those there are
            print(f"the rank set {args.name!r} is not running")
            return
    elif not api.is_running():
        print("no ranks are running")
        return
    left = api.stop(args.name)
    if auto_cells.turn_off(shell):
        print("auto mode off: plain cells run in the notebook")
    if left:
        print(f"stopped; processes still alive: {left}")
    else:
        print("ranks stopped")


def _restart_args(p) -> None:
    p.add_argument("-n", type=positive_int, default=None, help="new number of ranks (default: same)")
    p.add_argument("--backend", choices=BACKENDS, default=None)
    p.add_argument("--timeout", type=seconds, default=None)
    p.add_argument("--resume", action="store_true", help="then rebuild the model and load the latest checkpoint")
    p.add_argument("--setup", default=None, help="with --resume: notebook variable holding the setup code")
    p.add_argument("--dir", default=None, help="with --resume: checkpoint folder")


@command("restart", "stop the ranks (dead or alive) and start them again [--resume]", _restart_args)
def _restart(args, shell):
    if args.resume:  # the same as `%distrain ckpt resume`
        from .. import checkpoints as ck
        from ..runs.resume import resume
        from .ckpt import setup_from

        info = resume(
            setup=setup_from(args.setup, shell), n=args.n, root=args.dir, backend=args.backend, timeout=args.timeout
        )
        print(f"{info['restarted']} ranks up again; {ck.describe_load(info)}")
        return None
    if args.setup or args.dir:
        raise UsageError("--setup and --dir go with --resume")
    lost = api.current().lost_hosts if api.is_running() else []
    rs = api.restart(args.n, backend=args.backend, timeout=args.timeout)
    where = f" on {rs.config.hosts} (lost: {', '.join(lost)})" if lost else ""
    print(f"{rs.world_size} ranks up again{where} in {rs.start_seconds:.1f} s")


@command("status", "rank, host, pid, device, memory and state of each rank")
def _status(args, shell):
    rows = api.status()
    where = api.current().allocation()
    if where:
        print(where)
    dead = [r for r in rows if r["state"] == "dead"]
    lost = api.current().lost_hosts
    if dead:
        print(
            "; ".join(f"rank {r['rank']} (host {r['host']}, pid {r['pid']}) {r['exit']}" for r in dead)
            + (
                f" -- host {', '.join(lost)} lost: `%distrain restart` brings the rank set back on the hosts left"
                if lost
                else " -- `%distrain restart` brings the rank set back"
            )
        )
    import pandas as pd

    return pd.DataFrame(rows).set_index("rank")


def _push_args(p) -> None:
    p.add_argument("names", nargs="+", help="notebook variables to copy to the ranks")
    p.add_argument("--ranks", type=rank_selection, default=None, help="0,2-3 or all (default all)")


@command("push", "copy notebook variables to the ranks", _push_args)
def _push(args, shell):
    ns = shell.user_ns if shell is not None else {}
    missing = [n for n in args.names if n not in ns]
    if missing:
        raise UsageError(f"no notebook variable named {', '.join(missing)}: define it first, then push")
    api.push({n: ns[n] for n in args.names}, ranks=args.ranks)


def _pull_args(p) -> None:
    p.add_argument("name", help="variable to fetch from the ranks")
    p.add_argument("--ranks", type=rank_selection, default=None, help="0,2-3 or all (default all)")


@command("pull", "fetch a variable from the ranks (a list, one value per rank)", _pull_args)
def _pull(args, shell):
    return api.pull(args.name, ranks=args.ranks)
