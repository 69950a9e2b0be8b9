"""The session's run part, changed only by this package: the current run, where each start's
status events begin, the hang reports, and the run carried by ``detach``/``attach``."""

from __future__ import annotations

import contextlib

from .. import api
from .. import session as sessions
from .contract import KINDS, CannotCarry, Run


def current(sess) -> Run | None:
    """The session's current run (None before any ``train start``)."""
    return sess.runs.current


def adopt(sess, run: Run) -> Run:
    """Make ``run`` the session's current run; the one before is no longer watched."""
    old, sess.runs.current = sess.runs.current, run
    if old is not None and old is not run:
        old.close()
    run._changed()
    return run


def begin(sess, run_id: str, mark: int) -> None:
    """A start of ``run_id``: its status events begin at number ``mark`` of the store's."""
    sess.runs.marks[run_id] = mark
    sess.runs.started = run_id


def note_hang(sess, report: dict) -> None:
    """A step-timeout diagnosis: kept, put into the run's stream as a log line (rank -1), said."""
    from ...shared import events

    sess.runs.hangs.append(report)
    if sess.store is not None:
        sess.store.add([events.log_event(run=report["run"], rank=-1, text=report["text"])])
    print(report["text"], flush=True)


@contextlib.contextmanager
def recovering(sess):
    """A restart inside this block continues the session's run: the stream keeps its store, the
    dashboard stays open and the started run stays the same."""
    sess.runs.recovering = True
    try:
        yield
    finally:
        sess.runs.recovering = False


def carry_refusal(sess) -> str | None:
    """Why the session's run cannot move to another process now (None: it can)."""
    run = sess.runs.current
    if run is not None and run.cannot_carry and not run.wait(0):
        return run.cannot_carry
    return None


def carry(sess) -> dict:
    """The run part as another process takes it (``detach``/``attach``): the current run stops
    being watched here (a recovery under way finishes first) and travels as its kind's state."""
    run, sess.runs.current = sess.runs.current, None
    state = run.to_state() if run is not None else None
    return {
        "marks": dict(sess.runs.marks),
        "started": sess.runs.started,
        "hangs": list(sess.runs.hangs),
        "run": {"kind": run.kind, "state": state} if state is not None else None,
    }


def take(sess, carried: dict) -> None:
    """The run part :func:`carry` gave, here; the run is watched from this process on."""
    sess.runs.marks = dict(carried["marks"])
    sess.runs.started = carried["started"]
    sess.runs.hangs = list(carried["hangs"])
    kept = carried.get("run")
    if kept is not None:
        if kept["kind"] not in KINDS:
            raise CannotCarry(f"no kind of run named {kept['kind']!r} here (known: {', '.join(KINDS)})")
        adopt(sess, KINDS[kept["kind"]].from_state(sess, kept["state"]))


def _new_ranks(rankset) -> None:
    """A set started by hand names no run yet (a recovery's new set goes on with its run)."""
    sess = sessions.of(rankset)
    if not sess.runs.recovering:
        sess.runs.started = None


api.on("started", _new_ranks)
