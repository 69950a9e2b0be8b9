"""``%distrain attach --session NAME``: take a detached session back into this kernel."""

from __future__ import annotations

from .. import handoff
from . import flags
from .registry import command


def _attach_args(p) -> None:
    flags.SESSION.add(
        p,
        help="the name it was detached under (a name that is not there lists the detached sets)",
        required=True,
    )
    p.earlier_positional = "--session"


@command(
    "attach",
    "take a detached session back into this kernel: ranks, metrics history, dashboard",
    _attach_args,
    session="own",
)
def _attach(args, shell):
    sess = handoff.attach(session=args.session)
    store = sess.store
    run = sess.runs.started or (store.latest_run() if store is not None else None)
    steps = store.last_steps(run) if store is not None and run else {}
    where = f"; run {run} at step {max(steps.values())}" if steps else ""
    print(f"attached {sess.name!r}: {sess.rankset.world_size} ranks{where}")
    if sess.trackers.by_kind:
        print(f"trackers carried back (same runs): {', '.join(sess.trackers.by_kind)}")
    if sess.runs.current is not None:  # the run goes on here, as its kind carried it
        print(sess.runs.current.status_text())
    if shell is not None and getattr(shell, "kernel", None) is not None:
        from ..dashboard import dashboard

        dashboard(sess.rankset)
