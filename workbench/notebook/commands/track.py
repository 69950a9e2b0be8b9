"""``%distrain track start KIND [--dir PATH]``, ``track stop [KIND]``, ``track list``: the
session's stream mirrored into an experiment tracker (:mod:`workbench.notebook.trackers`)."""

from __future__ import annotations

import shlex

from . import flags
from .registry import UsageError, command

KINDS = ("tensorboard", "mlflow", "wandb", "trackio")  # as trackers.KINDS, without importing it here


def _start_args(p) -> None:
    p.add_argument("kind", choices=KINDS, help="the tracker: " + ", ".join(KINDS))
    flags.DIR.add(p, help="the folder for the tracker's run (default workbench-tracking/KIND)")
    p.add_argument(
        "--metrics",
        default=None,
        metavar="LIST",
        help="only these metrics, comma-separated names or patterns: loss,lr,memory_* (default all)",
    )
    flags.SESSION.add(p)


def _stop_args(p) -> None:
    p.add_argument("kind", nargs="?", choices=KINDS, default=None, help="the tracker to end (default: every one)")
    flags.SESSION.add(p)


def _earlier_kind(kind: str):
    def refusal(words: list[str]) -> str:
        line = shlex.join(["track", "start", kind, *words])
        return f"`track {kind}` is now `track start {kind}`: `%distrain {line}`; nothing was run"

    return refusal


ACTIONS = {
    "start": ("mirror this session's steps into a tracker (local, offline)", _start_args),
    "stop": ("write what is waiting and end this session's tracker run(s)", _stop_args),
    "list": ("the open trackers: where each writes, steps written, errors", None),
}


@command(
    "track",
    "mirror the session's metrics into TensorBoard, MLflow, W&B (offline) or trackio: start KIND | stop | list",
    actions=ACTIONS,
    earlier_actions={k: _earlier_kind(k) for k in KINDS},
)
def _track(args, shell):
    from .. import trackers

    try:
        if args.action == "list":
            return trackers.tracking()
        if args.action == "stop":
            done = trackers.untrack(args.kind)
            for info in done:
                print(f"{info['tracker']}: {info['steps']} steps written, ended; read it with: {info['where']}")
            return None
        tracker = trackers.track(args.kind, args.dir, metrics=args.metrics)
    except trackers.TrackerError as exc:
        raise UsageError(str(exc)) from None
    info = tracker.info()
    print(f"{info['tracker']}: mirroring session {info['session']!r}; read it with: {info['where']}")
    return None
