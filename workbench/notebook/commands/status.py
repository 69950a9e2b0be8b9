"""``%distrain status``: rank, host, pid, device, memory and state of each rank."""

from __future__ import annotations

from .. import api
from . import flags
from .registry import command


def _status_args(p) -> None:
    flags.SESSION.add(p)


@command("status", "rank, host, pid, device, memory and state of each rank", _status_args)
def _status(args, shell):
    rows = api.status()
    where = api.current().allocation()
    if where:
        print(where)
    synced = getattr(api.current(), "code_sync", None)
    for host in synced.status() if synced is not None else ():
        print(
            f"host {host['host']} (ranks {host['ranks']}): the notebook's files in {host['folder']}, "
            f"{host['files']} files, {host['size']}, last synced {host['synced']}"
        )
    dead = [r for r in rows if r["state"] == "dead"]
    lost = api.current().lost_hosts
    if dead:
        print(
            "; ".join(f"rank {r['rank']} (host {r['host']}, pid {r['pid']}) {r['exit']}" for r in dead)
            + (
                f" -- host {', '.join(lost)} lost: `%distrain restart` brings the rank set back on the hosts left"
                if lost
                else " -- `%distrain restart` brings the rank set back"
            )
        )
    import pandas as pd

    return pd.DataFrame(rows).set_index("rank")
