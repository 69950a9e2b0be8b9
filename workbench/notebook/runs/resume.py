"""Restart the ranks, repeat the setup, load the newest verified checkpoint: written once.

``workbench.restart(load=...)`` (``%distrain restart --load``) and a failure budget's recoveries
both come here, so a recovery does exactly what a person would type.
"""

from __future__ import annotations

import os


def restart_from_checkpoint(
    sess, setup=None, which: str | int | None = "latest", *, n=None, root=None, before_load=None, **restart_options
) -> dict:
    """Restart ``sess``'s ranks (dead or alive), run the setup there, load ``which``.

    ``setup``: code (str) run on every rank, or a function called here after the restart; by
    default the one given last (remembered for the next time), else the recorded ``workbench.train.setup(...)``.
    ``which=None``: restart and set up without loading (nothing was saved yet). ``before_load(rankset)``
    runs once the setup ran, before the load; a step it returns bounds the checkpoint loaded (the
    newest good one at that step or before). ``restart_options``: ``n``/``hosts``/``backend``/...
    for :func:`workbench.notebook.api.restart`.
    """
    from ...shared.checkpoint import catalog
    from ...shared.checkpoint.integrity import DamagedCheckpoint
    from .. import api, checkpoints, setup_recipe

    setup = setup if setup is not None else setup_recipe.repeatable_setup(sess)
    if setup is None:
        raise ValueError(
            "loading after a restart needs the setup that builds the model and calls checkpoint_hooks.track(...): "
            "workbench.restart(load='latest', setup=setup_code) or `%distrain restart --load --setup VAR` "
            "(or build the trainer with `%distrain train start --gpt tiny` first)"
        )
    root = os.path.abspath(os.path.expanduser(root)) if root else sess.checkpoint_dir
    latest = which in ("", "latest")
    if which is not None:
        try:  # refuse before restarting when there is nothing to load
            catalog.resolve(root, which)
        except DamagedCheckpoint:
            if not (latest and catalog.entries(root)):
                raise
    setup_recipe.remember(sess, setup)
    rs = api.restart(n, of=sess, **restart_options)
    if isinstance(setup, str):
        api.run(setup, display=False)
    else:
        setup()
    checkpoints.autosave_again(sess, rs)
    at_most = before_load(rs) if before_load is not None else None
    if which is None:
        info = {"name": None, "step": 0}
    else:  # `latest`: the newest good one
        info = checkpoints.load(which, root=root, skip_damaged=latest, rankset=rs, at_most=at_most if latest else None)
    info["restarted"] = rs.world_size
    return info
