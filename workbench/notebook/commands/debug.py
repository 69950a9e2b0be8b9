"""``%distrain debug --rank N``: pdb, post-mortem, on the last exception a rank raised."""

from __future__ import annotations

from ...engine import rpc
from ...shared.argtypes import non_negative_int
from .. import api
from ..cluster import debugging
from . import UsageError, command


def _debug_args(p) -> None:
    p.add_argument("--rank", type=non_negative_int, required=True, help="the rank whose last exception to enter")


@command("debug", "enter pdb post-mortem on a rank's last exception", _debug_args)
def _debug(args, shell):
    rs = api.current()
    if not 0 <= args.rank < rs.world_size:
        raise UsageError(f"--rank {args.rank} does not exist: the ranks are 0-{rs.world_size - 1}")
    if not rs.procs[args.rank].local:
        raise UsageError(
            f"rank {args.rank} runs on another host: the debugger attaches over "
            "loopback only, so it works for ranks on this host"
        )
    call = rs.submit(rpc.handle, rpc.PostMortem(), ranks=[args.rank])
    attached = False
    while not call.ar.ready():
        if debugging.waiting_sessions(rs).count(args.rank):
            attached = debugging.attach(rs, args.rank)
        else:
            call.ar.wait(0.05)
    (outcome,) = call.result(timeout=10)
    if not attached and outcome != "ok":
        print(f"rank {args.rank}: {outcome}")
