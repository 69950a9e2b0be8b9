"""The setup a session repeats: the teaching trainer's recipe (``workbench.train.setup(...)``) and
the code given to ``restart --load --setup``, which ``restart --load`` and a failure budget's
recoveries run again on a new rank set."""

from __future__ import annotations

from . import api, session, stream

NO_SETUP = (
    "--max-failures repeats the run's setup after a restart, and this session has none recorded: "
    "build the trainer with `%distrain train start --gpt tiny ...` (workbench.train.setup(...)), "
    "or name the notebook variable holding your setup code: `--setup VAR` (setup=code); nothing was started"
)


def setup(strategy: str = "ddp", *, model: str = "tiny", rankset=None, **options) -> list[dict]:
    """Build the teaching trainer on every rank: ``model`` GPT on bundled text under ``strategy``."""
    from ..engine import control

    rs = rankset if rankset is not None else api.current()
    stream.attach(rs)
    out = rs.apply(control.build_default, strategy, model=model, **options)
    sess = session.of(rs)
    sess.setup_recipe = {"strategy": strategy, "model": model, **options}
    sess.resume_setup = None  # the newest setup wins: `restart --load` repeats this one
    return out


def last_setup(sess=None):
    """A function repeating the session's latest :func:`setup` on its ranks (None if there was none).

    ``restart --load`` uses it when no setup code is given.
    """
    sess = sess if sess is not None else session.current()
    if sess is None or sess.setup_recipe is None:
        return None
    options = dict(sess.setup_recipe)

    def again():
        return setup(options.pop("strategy"), **options)

    again.from_recipe = True  # a detach carries the recipe, not this function
    return again


def repeatable_setup(sess):
    """The setup a recovery repeats: the code given to ``restart --load --setup``, else
    the latest ``workbench.train.setup(...)``; None with neither (then ``--max-failures`` is refused)."""
    return sess.resume_setup or last_setup(sess)
