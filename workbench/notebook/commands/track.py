"""``%distrain track tensorboard|mlflow|wandb|trackio [--dir D]``, ``track stop [KIND]``,
``track list``: the session's stream mirrored into an experiment tracker (``trackers``)."""

from __future__ import annotations

from . import UsageError, command

KINDS = ("tensorboard", "mlflow", "wandb", "trackio")  # as trackers.KINDS, without importing it here


def _dir_arg(kind: str):
    def build(p) -> None:
        p.add_argument("--dir", default=None, help=f"folder for the {kind} run (default workbench-tracking/{kind})")
        p.add_argument(
            "--metrics",
            default=None,
            help="only these metrics, comma-separated names or patterns: loss,lr,memory_* (default all)",
        )

    return build


def _stop_args(p) -> None:
    p.add_argument("kind", nargs="?", choices=KINDS, default=None, help="the tracker to end (default: every one)")


_ACTIONS = {k: (f"mirror this session's steps into {k} (local, offline)", _dir_arg(k)) for k in KINDS}
_ACTIONS["stop"] = ("write what is waiting and end this session's tracker run(s)", _stop_args)
_ACTIONS["list"] = ("the open trackers: where each writes, steps written, errors", None)


@command("track", "mirror the session's metrics into TensorBoard, MLflow, W&B (offline) or trackio", actions=_ACTIONS)
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
        tracker = trackers.track(args.action, args.dir, metrics=args.metrics)
    except trackers.TrackerError as exc:
        raise UsageError(str(exc)) from None
    info = tracker.info()
    print(f"{info['tracker']}: mirroring session {info['session']!r}; read it with: {info['where']}")
    return None
