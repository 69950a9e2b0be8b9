"""``%distrain pull NAME``: a variable from the ranks, one value per rank."""

from __future__ import annotations

from .. import api
from . import flags
from .registry import command


def _pull_args(p) -> None:
    p.add_argument("name", help="variable to fetch from the ranks")
    flags.RANKS.add(p, help="the ranks to fetch from: 0,2-3 or all (default all)")
    flags.SESSION.add(p)


@command("pull", "fetch a variable from the ranks (a list, one value per rank)", _pull_args)
def _pull(args, shell):
    return api.pull(args.name, ranks=args.ranks)
