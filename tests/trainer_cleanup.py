"""Rank-side: :func:`clean_trainer`, which tests that train on the shared rank sets apply afterwards.

In a module of its own, importing nothing of the notebook side: the ranks import the module
of every function applied on them, and a check on real ranks (tests/unit/test_boundaries.py)
asserts that they hold no notebook module.
"""

from __future__ import annotations


def clean_trainer() -> bool:
    """Rank side: stop and forget any trainer, timing wrappers, auto-save and pending save.

    Tests that train on the shared rank sets call this on the ranks afterwards, so that
    the next test finds them as a fresh user would.
    """
    from workbench.engine import checkpoint_hooks, comm_timing, listeners, trainer
    from workbench.engine.checkpoint import save

    t = trainer._CURRENT
    if t is not None:
        t.stop()
        t.resume()
        t.wait(30)
    trainer._CURRENT = None
    listeners.forget_trainer()
    comm_timing.uninstall()
    checkpoint_hooks.set_autosave(None, None)
    save.wait()
    return True
