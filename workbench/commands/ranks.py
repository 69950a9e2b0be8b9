"""``%distrain start|stop|status|restart|push|pull``: the rank set's life cycle."""
from __future__ import annotations

from .. import api, auto_cells
from ..cluster.launchers import LAUNCHERS
from ..cluster.rankset import BACKENDS
from . import UsageError, command


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"expected a whole number of ranks, got {text!r}") from None
    if value < 1:
        raise UsageError(f"the number of ranks must be at least 1, got {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"expected seconds (a number), got {text!r}") from None
    if value <= 0:
        raise UsageError(f"a timeout must be positive, got {text}")
    return value


def _start_args(p) -> None:
    p.add_argument("-n", type=_positive_int, default=2, help="number of ranks (default 2)")
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: nccl with GPUs, else gloo")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local")
    p.add_argument("--timeout", type=_seconds, default=300.0, help="collective timeout in seconds")
    p.add_argument("--threads", type=_positive_int, default=None, help="torch threads per rank")
    p.add_argument("--auto", action="store_true", help="then run plain cells on the ranks (`%%distrain auto on`)")


@command("start", "start N ranks and initialise their process group", _start_args)
def _start(args, shell):
    rs = api.start(args.n, backend=args.backend, launcher=args.launcher, timeout=args.timeout,
                   threads=args.threads)
    backend = rs.info[0]["backend"] if rs.info else args.backend
    print(f"{rs.world_size} ranks up ({backend}, {args.launcher} launcher) in {rs.start_seconds:.1f} s")
    if args.auto:
        auto_cells.turn_on(shell)
        print(AUTO_ON)


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


@command("stop", "stop the ranks (every process they started)")
def _stop(args, shell):
    if not api.is_running():
        print("no ranks are running")
        return
    left = api.stop()
    if auto_cells.turn_off(shell):
        print("auto mode off: plain cells run in the notebook")
    if left:
        print(f"stopped; processes still alive: {left}")
    else:
        print("ranks stopped")


def _restart_args(p) -> None:
    p.add_argument("-n", type=_positive_int, default=None, help="new number of ranks (default: same)")
    p.add_argument("--backend", choices=BACKENDS, default=None)
    p.add_argument("--timeout", type=_seconds, default=None)
    p.add_argument("--resume", action="store_true", help="then rebuild the model and load the latest checkpoint")
    p.add_argument("--setup", default=None, help="with --resume: notebook variable holding the setup code")
    p.add_argument("--dir", default=None, help="with --resume: checkpoint folder")


@command("restart", "stop the ranks (dead or alive) and start them again [--resume]", _restart_args)
def _restart(args, shell):
    if args.resume:  # the same as `%distrain ckpt resume`
        from ..checkpoint import api as ck
        from .ckpt import setup_from

        info = ck.resume(setup=setup_from(args.setup, shell), n=args.n, root=args.dir, backend=args.backend,
                         timeout=args.timeout)
        print(f"{info['restarted']} ranks up again; {ck.describe_load(info)}")
        return None
    if args.setup or args.dir:
        raise UsageError("--setup and --dir go with --resume")
    rs = api.restart(args.n, backend=args.backend, timeout=args.timeout)
    print(f"{rs.world_size} ranks up again in {rs.start_seconds:.1f} s")


@command("status", "rank, host, pid, device, memory and state of each rank")
def _status(args, shell):
    rows = api.status()
    dead = [r for r in rows if r["state"] == "dead"]
    if dead:
        print("; ".join(f"rank {r['rank']} (host {r['host']}, pid {r['pid']}) {r['exit']}" for r in dead)
              + " -- `%distrain restart` brings the rank set back")
    import pandas as pd

    return pd.DataFrame(rows).set_index("rank")


def _push_args(p) -> None:
    p.add_argument("names", nargs="+", help="notebook variables to copy to the ranks")
    p.add_argument("--ranks", default=None, help="0,2-3 or all (default all)")


@command("push", "copy notebook variables to the ranks", _push_args)
def _push(args, shell):
    ns = shell.user_ns if shell is not None else {}
    missing = [n for n in args.names if n not in ns]
    if missing:
        raise UsageError(f"no notebook variable named {', '.join(missing)}: define it first, then push")
    api.push({n: ns[n] for n in args.names}, ranks=args.ranks)


def _pull_args(p) -> None:
    p.add_argument("name", help="variable to fetch from the ranks")
    p.add_argument("--ranks", default=None, help="0,2-3 or all (default all)")


@command("pull", "fetch a variable from the ranks (a list, one value per rank)", _pull_args)
def _pull(args, shell):
    return api.pull(args.name, ranks=args.ranks)
