"""Experiment trackers: a session's event stream mirrored into TensorBoard, MLflow, W&B
(offline) or trackio, from the notebook side. ``workbench.track("mlflow", dir="runs")``,
``workbench.untrack()``, ``workbench.tracking()``; ``%distrain track ...`` calls these.

One tracker run per session and tracker (see :mod:`.mirror` for what is written); it ends
when the session's ranks stop or on ``untrack``, and goes with a detached set (:func:`carry`).
Owns the session's ``trackers`` part. Nothing here imports a tracker's package before it is
asked for (they take seconds to import), nor torch.
"""

from __future__ import annotations

import importlib.util
import os

from .. import api
from .. import session as sessions
from .backends import BACKENDS, TrackerError
from .mirror import Tracker, series_name

__all__ = [
    "KINDS",
    "Tracker",
    "TrackerError",
    "default_dir",
    "parse_metrics",
    "series_name",
    "carry",
    "resume",
    "track",
    "tracking",
    "untrack",
]

KINDS = tuple(BACKENDS)
ROOT = "workbench-tracking"  # default: a folder per tracker under the notebook's folder


def default_dir(kind: str) -> str:
    return os.path.join(ROOT, kind)


def _session(name: str | None):
    if name is not None:
        return sessions.KERNEL.get(name)
    sess = sessions.current()
    if sess is None:
        raise TrackerError("no rank set to track yet: start one first (`%distrain start -n 2`)")
    return sess


def _backend(kind: str):
    if kind not in BACKENDS:
        raise TrackerError(f"unknown tracker {kind!r}: use one of {', '.join(KINDS)}")
    cls = BACKENDS[kind]
    if importlib.util.find_spec(cls.package) is None:
        raise TrackerError(
            f"the {kind} tracker needs the {cls.package!r} package, which is not installed here: "
            f"pip install 'distrain-workbench[{kind}]'"
        )
    return cls()


def parse_metrics(text: str | list | tuple | None) -> tuple[str, ...] | None:
    """``"loss,lr,memory_*"`` (or a list) -> patterns; None or ``"all"``: every metric."""
    if text is None or text == "all":
        return None
    items = text.split(",") if isinstance(text, str) else list(text)
    patterns = tuple(p.strip() for p in items if p.strip())
    if not patterns:
        raise TrackerError(
            f"metrics={text!r} names no metric: give names or patterns like 'loss,lr,memory_*', or 'all'"
        )
    return patterns


def track(
    kind: str,
    dir: str | None = None,  # noqa: A002 - the flag's name
    *,
    metrics: str | list | None = None,
    session: str | None = None,
) -> Tracker:
    """Mirror the session's stream (default: the current one) into tracker ``kind``
    (``tensorboard``, ``mlflow``, ``wandb``, ``trackio``) under ``dir`` (default
    ``workbench-tracking/<kind>``); ``metrics``: only these (``"loss,lr,memory_*"``),
    default all. The same tracker again with the same folder and metrics: the one already
    running (anything else is refused while it runs)."""
    backend = _backend(kind)
    patterns = parse_metrics(metrics)
    sess = _session(session)
    directory = os.path.abspath(dir or default_dir(kind))
    have = sess.trackers.by_kind.get(kind)
    if have is not None and not have.closed:
        if have.directory == directory and have.metrics == patterns:
            return have
        was = f"{have.directory} with metrics {','.join(have.metrics) if have.metrics else 'all'}"
        raise TrackerError(
            f"session {sess.name!r} already mirrors to {kind} in {was}: "
            f"`%distrain track stop {kind}` first to start another"
        )
    tracker = Tracker(backend, sess, directory, patterns)
    sess.trackers.by_kind[kind] = tracker
    return tracker


def untrack(kind: str | None = None, *, session: str | None = None) -> list[dict]:
    """End the session's tracker ``kind`` (default: every one): the steps still waiting are
    written and the tracker run is closed. Returns what each had written."""
    if kind is not None and kind not in BACKENDS:
        raise TrackerError(f"unknown tracker {kind!r}: use one of {', '.join(KINDS)}")
    sess = _session(session)
    kinds = [kind] if kind is not None else list(sess.trackers.by_kind)
    if kind is not None and (kind not in sess.trackers.by_kind or sess.trackers.by_kind[kind].closed):
        open_ = [k for k, t in sess.trackers.by_kind.items() if not t.closed]
        raise TrackerError(f"session {sess.name!r} has no open {kind} tracker; open: {', '.join(open_) or 'none'}")
    out = []
    for k in kinds:
        tracker = sess.trackers.by_kind.pop(k)
        tracker.close()
        out.append(tracker.info())
    return out


def tracking(session: str | None = None) -> list[dict]:
    """Every open tracker of the kernel's sessions (or of ``session``): where, how many steps, errors."""
    chosen = [sessions.KERNEL.get(session)] if session is not None else list(sessions.KERNEL.by_name.values())
    cur = sessions.current()
    if session is None and cur is not None and cur not in chosen:
        chosen.append(cur)
    return [t.info() for s in chosen for t in s.trackers.by_kind.values()]


def carry(sess) -> list[dict]:
    """The session's open trackers, taken from this process for another one (``detach``/``attach``):
    their runs stay open; :func:`resume` there writes on into them."""
    out = []
    for kind in list(sess.trackers.by_kind):
        tracker = sess.trackers.by_kind.pop(kind)
        if tracker.closed:
            continue
        try:
            out.append(tracker.carry())
        except Exception as exc:  # never fail a hand-over half done: say it, end the run here
            print(
                f"the {kind} tracker could not be carried ({type(exc).__name__}: {exc}): its run "
                f"{tracker.run_name} ends here; `%distrain track start {kind} --dir {tracker.directory}` starts a new one"
            )
            tracker.close()
    return out


def resume(sess, carried: list[dict]) -> list[str]:
    """Open again in this process the trackers :func:`carry` took (before the session's store
    takes any new row); returns a line for each that could not be, saying how to track again."""
    failed = []
    for c in carried or ():
        kind = c["kind"]
        try:
            sess.trackers.by_kind[kind] = Tracker.resumed(_backend(kind), sess, c)
        except Exception as exc:
            failed.append(
                f"the {kind} tracker (run {c['run_name']} in {c['directory']}) could not be opened again here: "
                f"{type(exc).__name__}: {exc}; `%distrain track start {kind} --dir {c['directory']}` starts a new run"
            )
    return failed


def _on_stopping(rankset) -> None:
    """The ranks stop: each tracker writes what it has and ends its run."""
    sess = sessions.of(rankset)
    for kind in list(sess.trackers.by_kind):
        try:
            sess.trackers.by_kind.pop(kind).close()
        except Exception:  # never fail a stop
            pass


api.on("stopping", _on_stopping)
