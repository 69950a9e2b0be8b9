"""``%distrain use NAME`` and ``%distrain sessions``: several named rank sets in one kernel."""

from __future__ import annotations

from .. import api, handoff, session
from . import command


def _use_args(p) -> None:
    p.add_argument("name", help="the session to make current (`%%distrain sessions` lists them)")


@command("use", "make the named rank set current (`start --name NAME` made it)", _use_args)
def _use(args, shell):
    sess = api.use(args.name)
    state = f"{sess.rankset.world_size} ranks" if sess.running else "not running"
    print(f"using {sess.name!r} ({state})")


@command("sessions", "the named rank sets of this kernel, which is current, and the detached ones")
def _sessions(args, shell):
    now = session.current().name if session.current() is not None else None
    for name, sess in api.sessions().items():
        mark = "*" if name == now else " "
        state = f"{sess.rankset.world_size} ranks running" if sess.running else "stopped"
        print(f"{mark} {name}: {state}, checkpoints in {sess.checkpoint_dir}")
    detached = {n: e for n, e in handoff.detached_sets().items() if n not in api.sessions()}
    for name, entry in sorted(detached.items()):
        print(
            f"  {name}: {entry.get('world_size')} ranks, detached (keeper pid {entry.get('keeper_pid')}): "
            f"`%distrain attach {name}`"
        )
    if not api.sessions() and not detached:
        print("no sessions yet: `%distrain start -n 2 [--name NAME]`")
