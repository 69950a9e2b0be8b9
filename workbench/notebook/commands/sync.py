"""``%distrain sync``: the synced folders' edits to the ranks' other hosts now, and what moved."""

from __future__ import annotations

from .. import api
from . import flags
from .registry import command


def _sync_args(p) -> None:
    flags.SESSION.add(p)


@command("sync", "send the notebook folders' edits to the ranks' other hosts now, and say what moved", _sync_args)
def _sync(args, shell):
    rs = api.current()
    report = api.sync()
    if report is None:
        print(
            "nothing to sync: every rank runs on this host and imports from the notebook's folder"
            if rs.code_sync is None or not rs.code_sync.hosts
            else "nothing to sync: the set was started with --no-sync"
        )
        return
    lines = report.lines(rs.config.sync.limit)
    if not report.moved:
        hosts = ", ".join(sorted(rs.code_sync.hosts))
        lines.append(f"nothing changed since the last sync: {hosts} hold the notebook's files")
    for line in lines:
        print(line)
