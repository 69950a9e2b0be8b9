"""``%distrain train start|pause|resume|stop|set|status|wait`` and ``%distrain dashboard``.

Thin: parse, then call :mod:`workbench.notebook.training` / :mod:`workbench.dashboard`, which
users may call from Python just the same.
"""
from __future__ import annotations

import ast

from .. import api, training
from . import UsageError, command

ACTIONS = ("start", "pause", "resume", "stop", "set", "status", "wait")


def _train_args(p) -> None:
    p.add_argument("action", choices=ACTIONS, help="what to do with the ranks' trainer")
    p.add_argument("values", nargs="*", help="for set: NAME=VALUE pairs, e.g. lr=3e-4 betas=0.9,0.95")
    p.add_argument("--steps", type=int, default=None, help="start: how many more steps (default 100)")
    p.add_argument("--model", default=None, help="start: build the teaching trainer (tiny GPT) first, e.g. tiny")
    p.add_argument("--strategy", default=None, help="start: strategy spec for --model (default ddp)")
    p.add_argument("--batch-size", type=int, default=8, help="start with --model: global batch size")
    p.add_argument("--lr", type=float, default=1e-3, help="start with --model: learning rate")
    p.add_argument("--grad-accum", type=int, default=1, help="start with --model: micro-batches per step")
    p.add_argument("--step-timeout", type=float, default=None, metavar="S",
                   help="start: after S s without a step, show which ranks are stuck and where")
    p.add_argument("--no-dashboard", action="store_true", help="start: do not open the dashboard")
    p.add_argument("--timeout", type=float, default=600.0, help="wait: seconds (default 600)")


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


@command("train", "train on the ranks: start --steps N | pause | resume | stop | set lr=3e-4 | status | wait",
         _train_args)
def _train(args, shell):
    if args.action != "set" and args.values:
        raise UsageError(f"`train {args.action}` takes no NAME=VALUE arguments (got {' '.join(args.values)})")
    if args.action == "start":
        steps = 100 if args.steps is None else args.steps
        if steps < 1:
            raise UsageError(f"--steps must be at least 1, got {steps}")
        if args.step_timeout is not None and args.step_timeout <= 0:
            raise UsageError(f"--step-timeout must be positive seconds, got {args.step_timeout}")
        if args.model or args.strategy:
            training.setup(args.strategy or "ddp", model=args.model or "tiny", batch_size=args.batch_size,
                           lr=args.lr, grad_accum=args.grad_accum)
        run = training.start(steps, step_timeout=args.step_timeout)
        print(f"training {run}: {steps} steps on {api.current().world_size} ranks (in the background)")
        if not args.no_dashboard:
            from ..dashboard import dashboard

            dashboard()
        return None
    if args.action == "set":
        pairs = parse_pairs(args.values)
        if not pairs:
            raise UsageError("`train set` needs NAME=VALUE pairs, e.g. `%distrain train set lr=3e-4`")
        applied = training.set(**pairs)
        print("from the next step or the one after, on every rank: " + ", ".join(f"{k}={v}" for k, v in applied.items()))
        return None
    if args.action in ("pause", "resume", "stop"):
        getattr(training, args.action)()
        print(f"{args.action} requested: takes effect on every rank at the same step")
        return None
    if args.action == "wait":
        return training.wait(timeout=args.timeout)
    import pandas as pd

    return pd.DataFrame(training.status()).set_index("rank")


def _dashboard_args(p) -> None:
    p.add_argument("--export", default=None, metavar="PATH", help="write a standalone HTML file instead")
    p.add_argument("--run", default=None, help="show this run (default: follow the latest)")


@command("dashboard", "live plots and controls of the training run (--export PATH for HTML)", _dashboard_args)
def _dashboard(args, shell):
    from ..dashboard import dashboard

    dash = dashboard(run=args.run, show=args.export is None)
    if args.export:
        path = dash.export_html(args.export)
        print(f"dashboard written to {path}")
        return None
    return None
