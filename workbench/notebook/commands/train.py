"""``%distrain train start|pause|resume|stop|set|status|wait``: the run on the ranks.

Thin: parse, then call :mod:`workbench.notebook.training`, which users may call from Python
just the same.
"""

from __future__ import annotations

import ast

from ...shared.argtypes import MODEL_SIZES, positive_float, positive_int, seconds
from .. import api, session, training
from . import UsageError, command, flags


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
    if args.action == "start":
        if args.fault_tolerant:
            return _start_fault_tolerant(args)
        for flag, value in (("--replicas", args.replicas), ("--quorum-timeout", args.quorum_timeout)):
            if value is not None:
                raise UsageError(f"{flag} goes with --fault-tolerant; nothing was started")
        return _start(args, shell)
    current = session.KERNEL.current()  # None before any start: the calls below say so as before
    ft = current.fault_tolerant if current is not None else None
    if ft is not None and not ft.done.is_set() and args.action != "status" and args.action != "wait":
        return _fault_tolerant_action(ft, args.action)
    if args.action == "set":
        applied = training.set(**parse_pairs(args.values))
        print(
            "from the next step or the one after, on every rank: " + ", ".join(f"{k}={v}" for k, v in applied.items())
        )
        return None
    if args.action in ("pause", "resume", "stop"):
        getattr(training, args.action)()
        print(f"{args.action} requested: takes effect on every rank at the same step")
        return None
    if args.action == "wait":
        return training.wait(timeout=args.timeout)
    import pandas as pd

    if ft is not None and ft.rankset is api.current() and api.session().started_run == ft.run:
        from ...engine import fault_tolerant

        print(ft.status_text())
        dead = {d["rank"] for d in api.current().dead()}  # a replica left out, a rank lost after the end
        live = [r for r in range(api.current().world_size) if r not in dead]
        rows = api.current().apply(fault_tolerant.status, ranks=live)
        return pd.DataFrame(rows).set_index("rank")
    sup = api.session().supervisor
    if sup is not None:
        print(sup.status_text())
        if not api.is_running() or (sup.state == "gave up" and api.current().dead()):
            return None  # a dead rank answers nothing: the summary above says what happened
    rows = training.status()  # a rank without a trainer answers without its rank number
    return pd.DataFrame([{"rank": i, **r} for i, r in enumerate(rows)]).set_index("rank")


def _start(args, shell):
    """Build the teaching GPT when asked (--gpt/--strategy); otherwise --lr/--grad-accum
    change the trainer already on the ranks. Every refusal comes before anything changes."""
    build = args.gpt is not None or args.strategy is not None
    if args.setup is not None and args.max_failures is None:
        raise UsageError("--setup names the code a recovery repeats: it goes with --max-failures K")
    setup = None
    if args.setup is not None:
        setup = flags.setup_from(args.setup, shell)
    elif args.max_failures is not None and not build:
        from ..setup_recipe import NO_SETUP, repeatable_setup

        if repeatable_setup(api.session()) is None:
            raise UsageError(NO_SETUP)
    changes = {k: v for k, v in (("lr", args.lr), ("grad_accum", args.grad_accum)) if v is not None}
    if build:
        training.setup(
            args.strategy or "ddp",
            model=args.gpt or "tiny",
            batch_size=args.batch_size or 8,
            lr=args.lr or 1e-3,
            grad_accum=args.grad_accum or 1,
        )
    else:
        if args.batch_size is not None:
            raise UsageError(
                "--batch-size sizes the teaching GPT that --gpt/--strategy build; a trainer "
                "already on the ranks draws its batches from its own data: add --gpt tiny to "
                "rebuild, or change the batch in your setup code; nothing was done"
            )
        states = {s["state"] for s in training.status()} if changes else set()
        given = ", ".join("--" + k.replace("_", "-") for k in changes)
        if "none" in states:
            raise UsageError(
                f"{given} change the trainer on the ranks, and there is none yet: add --gpt tiny "
                "(builds the teaching GPT) or build a Trainer in a %%distrain cell; nothing was done"
            )
        if states & {"running", "paused"}:
            raise UsageError(
                f"training is already {'/'.join(sorted(states & {'running', 'paused'}))}, so {given} "
                "would not start a run: `%distrain train set lr=...` changes it live; nothing was done"
            )
        if changes:
            training.set(**changes)
    run = training.start(args.steps, step_timeout=args.step_timeout, max_failures=args.max_failures, setup=setup)
    with_ = f" with {', '.join(f'{k}={v}' for k, v in changes.items())}" if changes else ""
    budget = f", recovering by itself up to {args.max_failures} times" if args.max_failures else ""
    print(f"training {run}: {args.steps} steps on {api.current().world_size} ranks{with_}{budget} (in the background)")
    if not args.no_dashboard:
        from ..dashboard import dashboard

        dashboard()
    return None


def _start_fault_tolerant(args):
    """``train start --fault-tolerant``: refusals first (one line each), then the run (notebook.fault_tolerance)."""
    from .. import fault_tolerance

    given = [
        flag
        for flag, value in (
            ("--max-failures", args.max_failures),
            ("--setup", args.setup),
            ("--step-timeout", args.step_timeout),
            ("--grad-accum", args.grad_accum),
        )
        if value is not None
    ]
    if given:
        raise UsageError(
            f"{', '.join(given)} cannot go with --fault-tolerant: a fault-tolerant run replaces a lost replica "
            "itself while the others keep stepping (--quorum-timeout bounds the wait); --max-failures restarts "
            "the whole set instead; give one or the other; nothing was started"
        )
    try:
        run = fault_tolerance.start(
            args.steps,
            replicas=args.replicas,
            quorum_timeout=args.quorum_timeout or 10.0,
            strategy=args.strategy or "ddp",
            model=args.gpt or "tiny",
            batch_size=args.batch_size or 8,
            lr=args.lr or 1e-3,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(
        f"training {run.run}: {args.steps} steps, {run.replicas} torchft replica groups x {run.group_size} ranks"
        + (" (each sharded over its ranks, hsdp)" if run.strategy == "hsdp" else "")
        + ", "
        f"quorum timeout {run.quorum_timeout:g} s (in the background)"
    )
    if not args.no_dashboard:
        from ..dashboard import dashboard

        dashboard()
    return None


def _fault_tolerant_action(ft, action: str):
    if action != "stop":
        raise UsageError(
            f"`train {action}` changes the workbench trainer; the fault-tolerant run {ft.run} takes "
            "`train stop`, `train status` and `train wait`"
        )
    at = ft.stop()
    print(f"stop requested: the fault-tolerant run {ft.run} stops after step {at} on every rank")
    return None
