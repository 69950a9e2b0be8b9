"""``%distrain start``: N ranks and their process group; the session becomes current."""

from __future__ import annotations

from ...shared.argtypes import byte_size, positive_int
from .. import api, auto_cells
from ..cluster.launchers import FRAMEWORKS, LAUNCHERS
from . import flags
from .auto import AUTO_ON
from .registry import UsageError, command


def _start_args(p) -> None:
    flags.N.add(p, help="the number of ranks (default 2, or the --hosts total)")
    flags.BACKEND.add(p, default="auto")
    flags.COLLECTIVE_TIMEOUT.add(
        p, default=300.0, help="seconds a collective may take before torch raises (default 300)"
    )
    p.add_argument("--launcher", choices=LAUNCHERS, default="local", help="how the ranks are started")
    p.add_argument("--framework", choices=FRAMEWORKS, default="torch", help="jax: the ranks run jax.distributed")
    p.add_argument("--threads", type=positive_int, default=None, help="torch threads per rank")
    p.add_argument("--nccl", default=None, help="NCCL settings for the ranks, e.g. ALGO=Ring,PROTO=Simple")
    p.add_argument("--nccl-preset", default=None, help="NCCL settings per fabric: ib, roce or nvl72")
    p.add_argument("--auto", action="store_true", help="then run plain cells on the ranks (`%%distrain auto on`)")
    p.add_argument("--ip", default=None, help="slurm/ssh/ray: this host's address the ranks connect to")
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
        "--sync",
        nargs="*",
        metavar="PATH",
        default=None,
        help="ssh/slurm/ray: the folders whose files reach the other hosts (default the working folder)",
    )
    p.add_argument(
        "--sync-limit",
        type=byte_size,
        default=None,
        help="ssh/slurm/ray: a file larger than this is named and not sent (default 64M)",
    )
    p.add_argument("--no-sync", action="store_true", help="ssh/slurm/ray: send no folder to the other hosts")
    flags.SESSION.add(
        p,
        help="the new session's name, beside the others (`%%distrain use --session NAME` switches; default: the current one's)",
    )
    p.was("--name", "--session", "the one way to name a session")
    p.was("--timeout", "--collective-timeout", "--timeout is how long a command waits")


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


@command("start", "start N ranks and their process group; the session becomes current", _start_args, session="own")
def _start(args, shell):
    try:
        rs = api.start(
            _rank_count(args),
            backend=args.backend,
            launcher=args.launcher,
            collective_timeout=args.collective_timeout,
            threads=args.threads,
            ip=args.ip,
            hosts=args.hosts,
            ssh_config=args.ssh_config,
            python=args.python,
            slurm=_slurm_request(args),
            ray=_ray_request(args),
            progress=_live_line(),
            session=args.session,
            framework=args.framework,
            nccl=args.nccl,
            nccl_preset=args.nccl_preset,
            sync=tuple(args.sync) if args.sync else None,
            sync_limit=args.sync_limit,
            no_sync=args.no_sync,
        )
    except ValueError as exc:  # bad settings: one line, nothing started
        raise UsageError(str(exc)) from None
    backend = rs.info[0]["backend"] if rs.info else args.backend
    if args.framework != "torch":
        backend = f"{args.framework}, {backend}"
    where = rs.allocation()
    named = f"{args.session!r}: " if args.session else ""
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
