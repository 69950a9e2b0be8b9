"""``%distrain use --session NAME``: make a session current."""

from __future__ import annotations

from .. import api
from . import flags
from .registry import command


def _use_args(p) -> None:
    flags.SESSION.add(p, help="the session to make current (`%%distrain sessions` lists them)", required=True)
    p.earlier_positional = "--session"


@command("use", "make a session current", _use_args, session="own")
def _use(args, shell):
    sess = api.use(args.session)
    state = f"{sess.rankset.world_size} ranks" if sess.running else "not running"
    print(f"using {sess.name!r} ({state})")
