"""``%distrain push NAME ...``: copy notebook variables to the ranks."""

from __future__ import annotations

from .. import api
from . import flags
from .registry import UsageError, command


def _push_args(p) -> None:
    p.add_argument("names", nargs="+", help="notebook variables to copy to the ranks")
    flags.RANKS.add(p, help="the ranks to copy to: 0,2-3 or all (default all)")
    flags.SESSION.add(p)


@command("push", "copy notebook variables to the ranks", _push_args)
def _push(args, shell):
    ns = shell.user_ns if shell is not None else {}
    missing = [n for n in args.names if n not in ns]
    if missing:
        raise UsageError(f"no notebook variable named {', '.join(missing)}: define it first, then push")
    api.push({n: ns[n] for n in args.names}, ranks=args.ranks)
