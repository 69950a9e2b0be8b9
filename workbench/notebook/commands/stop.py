"""``%distrain stop``: a session's ranks (every process they started), or a detached set."""

from __future__ import annotations

from .. import api, auto_cells, handoff
from . import flags
from .registry import command


def _stop_args(p) -> None:
    flags.SESSION.add(
        p, help="the session to stop (default: the current one), or a detached one; the others keep running"
    )
    p.was("--name", "--session", "the one way to name a session")


@command("stop", "stop a session's ranks (every process they started), or a detached set", _stop_args, session="own")
def _stop(args, shell):
    name = args.session
    if name is not None:
        if name not in api.sessions() and name in handoff.detached_sets():
            left = handoff.stop(name)  # a detached set, from any kernel
            print(
                f"stopped the detached set {name!r}; processes still alive: {left}"
                if left
                else f"stopped the detached set {name!r} and its keeper"
            )
            return
        if not api.session(name).running:  # an unknown name: the error names those there are
            print(f"the rank set {name!r} is not running")
            return
    elif not api.is_running():
        print("no ranks are running")
        return
    left = api.stop(name)
    if auto_cells.turn_off(shell):
        print("auto mode off: plain cells run in the notebook")
    if left:
        print(f"stopped; processes still alive: {left}")
    else:
        print("ranks stopped")
