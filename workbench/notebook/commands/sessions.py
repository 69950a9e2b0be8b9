"""``%distrain sessions``: the sessions of this kernel, which is current, and the detached ones."""

from __future__ import annotations

from .. import api, handoff, session
from .registry import command


@command("sessions", "the sessions of this kernel, which is current, and the detached ones")
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
            f"`%distrain attach --session {name}`"
        )
    if not api.sessions() and not detached:
        print("no sessions yet: `%distrain start -n 2 [--session NAME]`")
