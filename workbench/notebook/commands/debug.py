"""``%distrain debug --ranks N``: pdb, post-mortem, on the last exception a rank raised."""

from __future__ import annotations

from ...engine import rpc
from ...shared.errors import BadRanks
from .. import api
from ..cluster import debugging
from ..debugger import hub as debug_hub
from . import flags
from .registry import UsageError, command


def _debug_args(p) -> None:
    flags.RANKS.add(p, help="the rank whose last exception to enter (one)", required=True)
    flags.SESSION.add(p)
    p.was("--rank", "--ranks", "--ranks names ranks everywhere")


@command("debug", "pdb post-mortem on a rank's last exception", _debug_args)
def _debug(args, shell):
    rs = api.current()
    try:
        chosen = rs.select(args.ranks)
    except BadRanks as exc:
        raise UsageError(f"--ranks {args.ranks}: {exc}") from None
    if len(chosen) != 1:
        raise UsageError(f"--ranks {args.ranks} names {len(chosen)} ranks: debug enters one (e.g. --ranks {chosen[0]})")
    (rank,) = chosen
    # the rank's pdb talks to this kernel over the rank set's debug link, whichever host it is on
    call = rs.submit(rpc.handle, rpc.PostMortem(link=debug_hub.of(rs).link), ranks=[rank])
    attached = False
    while not call.ar.ready():
        if debugging.waiting_sessions(rs).count(rank):
            attached = debugging.attach(rs, rank)
        else:
            call.ar.wait(0.05)
    (outcome,) = call.result(timeout=10)
    if not attached and outcome != "ok":
        print(f"rank {rank}: {outcome}")
