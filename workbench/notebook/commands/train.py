"""``%distrain train start|pause|resume|stop|set|status|wait``: the run on the ranks.

Parse, call :mod:`workbench.notebook.training` (which users call from Python just the same,
with the same refusals), print.
"""

from __future__ import annotations

import ast

from ...shared.argtypes import MODEL_SIZES, positive_float, positive_int, seconds
from ...shared.errors import Refused
from .. import training
from . import flags
from .registry import UsageError, command


def _start_args(p) -> None:
    flags.STEPS.add(p, default=100, help="how many more steps (default 100)")
    p.add_argument(
        "--gpt",
        choices=MODEL_SIZES,
        default=None,
        metavar="SIZE",
        help="build the teaching GPT of this size (tiny or small) on the bundled text first",
    )
    p.add_argument("--strategy", default=None, help="the teaching GPT's layout (default ddp); builds it")
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        help="the teaching GPT's global batch size (default 8); with --gpt/--strategy",
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
    flags.SETUP.add(
        p,
        help="with --max-failures: the notebook variable holding the setup code a recovery repeats "
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
    flags.SESSION.add(p)
    p.was("--model", "--gpt", "--model is the planner's catalogue model")


def _session_only(p) -> None:
    flags.SESSION.add(p)


def _set_args(p) -> None:
    p.add_argument("values", nargs="+", metavar="NAME=VALUE", help="e.g. lr=3e-4 betas=0.9,0.95 grad_accum=2")
    flags.SESSION.add(p)


def _wait_args(p) -> None:
    flags.TIMEOUT.add(p, default=600.0, help="seconds to wait before saying where the run is (default 600)")
    flags.SESSION.add(p)


ACTIONS = {
    "start": ("run N more steps in the background (--gpt builds the teaching GPT first)", _start_args),
    "pause": ("hold the run at the same step on every rank", _session_only),
    "resume": ("let a paused run go on", _session_only),
    "stop": ("end the run at the next step on every rank", _session_only),
    "set": ("change hyperparameters on every rank at the same step", _set_args),
    "status": ("the run's kind and state, and each rank's trainer", _session_only),
    "wait": ("wait until the run is finished, stopped or gave up", _wait_args),
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
    "the run on the ranks: start --steps N | pause | resume | stop | set lr=3e-4 | status | wait",
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
        setup = flags.setup_from(args.setup, shell)
    training.start(
        args.steps,
        model=args.gpt,
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
