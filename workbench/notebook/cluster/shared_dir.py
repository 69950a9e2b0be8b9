"""Notebook side: refuse a checkpoint folder that not every host of the rank set shares.

Ranks on one host always share their folders; for a rank set over several hosts
(Slurm, SSH) the check costs three short calls on the ranks, run at each save.
"""

from __future__ import annotations

import secrets

from ...engine import rpc


class NotShared(RuntimeError):
    """Some ranks write where rank 0 cannot read (a folder local to each host)."""


def require(rankset, folder: str) -> None:
    hosts = {d.get("host") for d in (rankset.info or [])}
    if len(hosts) <= 1:
        return
    token = secrets.token_hex(8)
    rankset.apply(rpc.handle, rpc.SharedDirStep(step="leave", folder=folder, token=token), ranks=[0])
    answers = rankset.apply(rpc.handle, rpc.SharedDirStep(step="answer", folder=folder, token=token))
    collect = rpc.SharedDirStep(step="collect", folder=folder, token=token, world_size=rankset.world_size)
    seen = set(rankset.apply(rpc.handle, collect, ranks=[0])[0])
    bad = [a for a in answers if not a["sees"] or a["rank"] not in seen]
    if bad:
        where = "; ".join(
            f"rank {a['rank']} (host {a['host']}) {a['error'] or 'writes where rank 0 does not read'}" for a in bad
        )
        raise NotShared(
            f"checkpoint folder {folder} is not shared by every host: {where}. Give a folder "
            "every host mounts (the shared file system): workbench.ckpt.save(root=...) "
            "or %distrain ckpt save --dir ..."
        )
