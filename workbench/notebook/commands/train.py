"""``%distrain train start|pause|resume|stop|set|status|wait`` and ``%distrain dashboard``.

Parse, call :mod:`workbench.notebook.training` / :mod:`workbench.dashboard` (which users call
from Python just the same, with the same refusals), print.
"""

from __future__ import annotations

import ast

from ...shared.argtypes import MODEL_SIZES, positive_float, positive_int, seconds, session_names
from ...shared.errors import Refused
from .. import training
from ..session import UnknownSession
from . import UsageError, command


def _start_args(p) -> None:
    p.add_argument("--steps", type=positive_int, default=100, help="how many more steps (default 100)")
    p.add_argument(
        "--model",
        choices=MODEL_SIZES,
        default=None,
        help="build the teaching trainer (a GPT of this size on bundled text) first",
    )
    p.add_argument("--strategy", default=None, help="strategy spec for the teaching trainer (default ddp); builds it")
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="global batch size of the teaching trainer (default 8); with --model/--strategy",
    )
    p.add_argument(
        "--lr",
        type=positive_float,
        default=None,
        help="learning rate (default 1e-3 when building; else set on the ranks' trainer)",
    )
    p.add_argument(
        "--grad-accum",
        type=positive_int,
        default=None,
        help="micro-batches per step (default 1 when building; else set on the ranks' trainer)",
    )
    p.add_argument(
        "--step-timeout",
        type=seconds,
        default=None,
        metavar="S",
        help="after S s without a step, show which ranks are stuck and where",
    )
    p.add_argument(
        "--max-failures",
        type=positive_int,
        default=None,
        metavar="K",
        help="recover by itself up to K times (dead rank, hang past --step-timeout, NaN/spike pause): "
        "restart, repeat the setup, load the newest verified checkpoint, train on to the same step",
    )
    p.add_argument(
        "--setup",
        default=None,
        metavar="VAR",
        help="with --max-failures: notebook variable holding the setup code a recovery repeats "
        "(default: the trainer's recorded setup)",
    )
    p.add_argument(
        "--fault-tolerant",
        action="store_true",
        help="run each replica group as a torchft replica group: when a rank dies the other replicas keep "
        "stepping, its replica is restarted and heals from a live peer (ddp, gloo, local ranks; needs torchft)",
    )
    p.add_argument(
        "--replicas",
        type=positive_int,
        default=None,
        metavar="R",
        help="with --fault-tolerant: R replica groups of N/R consecutive ranks (default 2)",
    )
    p.add_argument(
        "--quorum-timeout",
        type=seconds,
        default=None,
        metavar="S",
        help="with --fault-tolerant: seconds the survivors wait for a silent replica before stepping without it (default 10)",
    )
    p.add_argument("--no-dashboard", action="store_true", help="do not open the dashboard")


def _set_args(p) -> None:
    p.add_argument("values", nargs="+", metavar="NAME=VALUE", help="e.g. lr=3e-4 betas=0.9,0.95 grad_accum=2")


def _wait_args(p) -> None:
    p.add_argument("--timeout", type=seconds, default=600.0, help="seconds (default 600)")


ACTIONS = {
    "start": ("run N more steps in the background (--model builds the teaching trainer first)", _start_args),
    "pause": ("pause every rank at the same step", None),
    "resume": ("resume a paused run", None),
    "stop": ("stop the run at the next step on every rank", None),
    "set": ("change hyperparameters on every rank at the same step", _set_args),
    "status": ("the trainer's state on each rank", None),
    "wait": ("wait until the run ends", _wait_args),
}


def parse_value(text: str):
    """``3e-4`` -> 3e-4, ``0.9,0.95`` -> (0.9, 0.95), ``True`` -> True; else the text."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return tuple(value) if isinstance(value, list) else value


def parse_pairs(values: list[str]) -> dict:
    out = {}
    for item in values:
        name, sep, raw = item.partition("=")
        if not sep or not name or not raw:
            raise UsageError(f"expected NAME=VALUE (e.g. lr=3e-4), got {item!r}")
        out[name.strip()] = parse_value(raw.strip())
    return out


@command(
    "train",
    "train on the ranks: start --steps N | pause | resume | stop | set lr=3e-4 | status | wait",
    actions=ACTIONS,
)
def _train(args, shell):
    try:
        return _act(args, shell)
    except Refused as exc:  # the API's own refusal, said as a usage error of the command
        raise UsageError(str(exc)) from None


def _act(args, shell):
    if args.action == "start":
        return _start(args, shell)
    if args.action == "set":
        applied = training.set(**parse_pairs(args.values))
        print(
            "from the next step or the one after, on every rank: " + ", ".join(f"{k}={v}" for k, v in applied.items())
        )
        return None
    if args.action in ("pause", "resume", "stop"):
        print(getattr(training, args.action)())
        return None
    if args.action == "wait":
        return training.wait(timeout=args.timeout)
    import pandas as pd

    run = training.current()
    if run is None:  # a trainer built and started in cells: the ranks say how it is
        rows = [{"rank": i, **r} for i, r in enumerate(training.status())]
    else:
        print(run.status_text())
        rows = run.rank_status()
    return pd.DataFrame(rows).set_index("rank") if rows else None


def _start(args, shell):
    setup = None
    if args.setup is not None:
        from .ckpt import setup_from

        training.check_start(
            args.steps,
            max_failures=args.max_failures,
            setup=args.setup,
            fault_tolerant=args.fault_tolerant,
            step_timeout=args.step_timeout,
            grad_accum=args.grad_accum,
            replicas=args.replicas,
            quorum_timeout=args.quorum_timeout,
        )  # what cannot go with --setup is said before the variable is looked up
        setup = setup_from(args.setup, shell)
    training.start(
        args.steps,
        model=args.model,
        strategy=args.strategy,
        batch_size=args.batch_size,
        lr=args.lr,
        grad_accum=args.grad_accum,
        step_timeout=args.step_timeout,
        max_failures=args.max_failures,
        setup=setup,
        fault_tolerant=args.fault_tolerant,
        replicas=args.replicas,
        quorum_timeout=args.quorum_timeout,
    )
    print(training.current().started_as)
    if not args.no_dashboard:
        from ..dashboard import dashboard

        dashboard()
    return None


def _dashboard_args(p) -> None:
    p.add_argument("--export", default=None, metavar="PATH", help="write a standalone HTML file instead")
    p.add_argument("--run", default=None, help="show this run (default: follow the latest)")
    p.add_argument(
        "--sessions",
        type=session_names,
        default=None,
        metavar="A,B",
        help="overlay the latest runs of these named sessions in one live dashboard",
    )


@command("dashboard", "live plots and controls of the training run (--export PATH for HTML)", _dashboard_args)
def _dashboard(args, shell):
    from ..dashboard import dashboard

    if args.sessions is not None:
        for flag, value in (("--run", args.run), ("--export", args.export)):
            if value is not None:
                raise UsageError(
                    f"{flag} goes with one session's dashboard, not with --sessions (which follows each "
                    "session's latest run live); for a file of both: workbench.compare(...).write_html(PATH)"
                )
        try:
            dashboard(sessions=args.sessions)
        except UnknownSession as exc:
            raise UsageError(str(exc)) from None
        return None
    dash = dashboard(run=args.run, show=args.export is None)
    if args.export:
        path = dash.export_html(args.export)
        print(f"dashboard written to {path}")
        return None
    return None
