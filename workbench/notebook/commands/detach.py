"""``%distrain detach``: hand a session to a keeper process that outlives the kernel."""

from __future__ import annotations

from .. import api, auto_cells, handoff, session
from . import flags
from .registry import command


def _detach_args(p) -> None:
    flags.SESSION.add(p, help="the session to detach (default: the current one)")
    p.was("--name", "--session", "the one way to name a session")


@command(
    "detach",
    "hand a session to a keeper process that outlives the kernel (training goes on)",
    _detach_args,
    session="own",
)
def _detach(args, shell):
    sess = api.session(args.session) if args.session is not None else session.current()
    name = sess.name if sess is not None else None
    tracked = [k for k, t in sess.trackers.by_kind.items() if not t.closed] if sess is not None else []
    entry = handoff.detach(session=args.session)
    if auto_cells.turn_off(shell):
        print("auto mode off: plain cells run in the notebook")
    print(
        f"detached {name!r}: {entry['world_size']} ranks held by keeper pid {entry['keeper_pid']}; "
        f"training goes on. `%distrain attach --session {name}` from any kernel takes it back, "
        f"`%distrain stop --session {name}` ends it"
    )
    if tracked:
        print(f"trackers carried to the keeper (same runs): {', '.join(tracked)}")
