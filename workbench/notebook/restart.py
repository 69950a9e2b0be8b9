"""``workbench.restart`` (``%distrain restart``): the rank set stopped and started again; with
``load``, the setup repeated and a checkpoint loaded, the one way back from a checkpoint."""

from __future__ import annotations

from . import api
from .cluster import NotRunning
from .keywords import refuse
from .runs.resume import restart_from_checkpoint
from .session import KERNEL


def restart(
    n: int | None = None,
    *,
    session: str | None = None,
    backend: str | None = None,
    collective_timeout: float | None = None,
    load: str | int | None = None,
    setup=None,
    dir: str | None = None,  # noqa: A002 - the flag's name
    **earlier,
):
    """Stop the ranks (dead or alive) and start a new set with the same settings, or ``n`` ranks.

    ``load``: then repeat the setup and load this checkpoint (``"latest"``: the newest verified one,
    a step or a tag) from ``dir`` (default: the session's folder). ``setup``: the code (a str run on
    every rank) or function that builds the model; default the one given last, else the recorded
    ``workbench.train.setup(...)``. Returns the new rank set; with ``load``, what was loaded (as
    ``workbench.ckpt.load`` says it, with ``restarted``: the new world size).
    ``session``: the session to restart (default the current one).
    """
    refuse("workbench.restart", earlier, {"timeout": "collective_timeout"})
    if load is None:
        if setup is not None or dir is not None:
            raise ValueError("setup= and dir= go with load= (repeat the setup and load a checkpoint); nothing was done")
        return api.restart(n, session=session, backend=backend, collective_timeout=collective_timeout)
    sess = KERNEL.get(session) if session is not None else KERNEL.current()
    if sess is None or sess.rankset is None:
        raise NotRunning("there is nothing to restart: start ranks with `%distrain start -n 2`")
    return restart_from_checkpoint(
        sess, setup, load, n=n, root=dir, backend=backend, collective_timeout=collective_timeout
    )
