"""``%distrain restart``: stop the ranks (dead or alive) and start the same set again;
``--load`` then repeats the setup and loads a checkpoint."""

from __future__ import annotations

from .. import api
from ..restart import restart
from . import flags
from .registry import UsageError, command


def _restart_args(p) -> None:
    flags.N.add(p, help="the new number of ranks (default: the same)")
    flags.BACKEND.add(p, help="the process group's backend (default: the same)")
    flags.COLLECTIVE_TIMEOUT.add(p, help="seconds a collective may take before torch raises (default: the same)")
    p.add_argument(
        "--load",
        nargs="?",
        const="latest",
        default=None,
        metavar="WHICH",
        help="then repeat the setup and load this checkpoint: latest (default), a step or a tag",
    )
    flags.SETUP.add(p, help="with --load: the notebook variable holding the setup code (default: the recorded one)")
    flags.DIR.add(p, help="with --load: the checkpoint folder (default: the session's)")
    flags.SESSION.add(p)
    p.was("--resume", "--load", "the one way back from a checkpoint")
    p.was("--timeout", "--collective-timeout", "--timeout is how long a command waits")


@command(
    "restart",
    "stop the ranks (dead or alive) and start them again; --load then repeats the setup and loads a checkpoint",
    _restart_args,
)
def _restart(args, shell):
    if args.load is None and (args.setup or args.dir):
        raise UsageError("--setup and --dir go with --load (repeat the setup and load a checkpoint); nothing was done")
    lost = api.current().lost_hosts if api.is_running() else []
    setup = flags.setup_from(args.setup, shell)
    result = restart(
        args.n,
        backend=args.backend,
        collective_timeout=args.collective_timeout,
        load=args.load,
        setup=setup,
        dir=args.dir,
    )
    if args.load is not None:
        from .. import checkpoints as ck

        print(f"{result['restarted']} ranks up again; {ck.describe_load(result)}")
        return None
    where = f" on {result.config.hosts} (lost: {', '.join(lost)})" if lost else ""
    print(f"{result.world_size} ranks up again{where} in {result.start_seconds:.1f} s")
    return None
