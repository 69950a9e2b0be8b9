"""``%distrain detach [--name N]`` and ``%distrain attach NAME``: a set that outlives its kernel."""

from __future__ import annotations

from .. import api, auto_cells, handoff, session
from . import command


def _detach_args(p) -> None:
    p.add_argument("--name", default=None, help="the named set to detach (default: the current one)")


@command("detach", "hand the ranks to a keeper process that outlives this kernel (training goes on)", _detach_args)
def _detach(args, shell):
    sess = api.session(args.name) if args.name is not None else session.current()
    name = sess.name if sess is not None else None
    tracked = [k for k, t in sess.trackers.by_kind.items() if not t.closed] if sess is not None else []
    entry = handoff.detach(args.name)
    if auto_cells.turn_off(shell):
        print("auto mode off: plain cells run in the notebook")
    print(
        f"detached {name!r}: {entry['world_size']} ranks held by keeper pid {entry['keeper_pid']}; "
        f"training goes on. `%distrain attach {name}` from any kernel takes it back, "
        f"`%distrain stop --name {name}` ends it"
    )
    if tracked:
        print(f"trackers carried to the keeper (same runs): {', '.join(tracked)}")


def _attach_args(p) -> None:
    p.add_argument(
        "name", metavar="NAME", help="the name it was detached under (a name that is not there lists the detached sets)"
    )


@command("attach", "take a detached set back into this kernel: ranks, metrics history, dashboard", _attach_args)
def _attach(args, shell):
    sess = handoff.attach(args.name)
    store = sess.store
    run = sess.runs.started or (store.latest_run() if store is not None else None)
    steps = store.last_steps(run) if store is not None and run else {}
    where = f"; run {run} at step {max(steps.values())}" if steps else ""
    print(f"attached {sess.name!r}: {sess.rankset.world_size} ranks{where}")
    if sess.trackers.by_kind:
        print(f"trackers carried back (same runs): {', '.join(sess.trackers.by_kind)}")
    if sess.runs.current is not None:
        print(sess.runs.current.status_text())
    if shell is not None and getattr(shell, "kernel", None) is not None:
        from ..dashboard import dashboard

        dashboard(sess.rankset)
