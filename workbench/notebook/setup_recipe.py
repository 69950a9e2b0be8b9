"""The setup a session repeats: the teaching trainer's recipe (``workbench.train.setup(...)``) and
the code given to ``restart --load --setup``, which ``restart --load`` and a failure budget's
recoveries run again on a new rank set. Owns the session's ``setup`` part."""

from __future__ import annotations

from . import api, session, stream

NO_SETUP = (
    "--max-failures repeats the run's setup after a restart, and this session has none recorded: "
    "build the trainer with `%distrain train start --gpt tiny ...` (workbench.train.setup(...)), "
    "or name the notebook variable holding your setup code: `--setup VAR` (setup=code); nothing was started"
)


def setup(strategy: str = "ddp", *, model: str = "tiny", rankset=None, **options) -> list[dict]:
    """Build the teaching trainer on every rank: ``model`` GPT on bundled text under ``strategy``."""
    from ..engine import rpc

    rs = rankset if rankset is not None else api.current()
    stream.attach(rs)
    out = rs.apply(rpc.handle, rpc.BuildTeachingTrainer(strategy=strategy, model=model, options=options))
    sess = session.of(rs)
    sess.setup.recipe = {"strategy": strategy, "model": model, **options}
    sess.setup.given = None  # the newest setup wins: `restart --load` repeats this one
    return [r.to_dict() for r in out]


def last_setup(sess=None):
    """A function repeating the session's latest :func:`setup` on its ranks (None if there was none).

    ``restart --load`` uses it when no setup code is given.
    """
    sess = sess if sess is not None else session.current()
    if sess is None or sess.setup.recipe is None:
        return None
    options = dict(sess.setup.recipe)

    def again():
        return setup(options.pop("strategy"), **options)

    again.from_recipe = True  # a detach carries the recipe, not this function
    return again


def repeatable_setup(sess):
    """The setup a recovery repeats: the code given to ``restart --load --setup``, else
    the latest ``workbench.train.setup(...)``; None with neither (then ``--max-failures`` is refused)."""
    return sess.setup.given or last_setup(sess)


def remember(sess, setup) -> None:
    """``setup`` (code or a function) is what the session repeats from now on; the recorded
    recipe's own function stands for the recipe, which stays the source."""
    sess.setup.given = None if getattr(setup, "from_recipe", False) else setup


def carry(sess, pack) -> dict:
    """The setup part as it travels to another process; ``pack`` turns a function into bytes."""
    return {"recipe": sess.setup.recipe, "given": pack(sess.setup.given)}


def take(sess, carried: dict, unpack) -> None:
    sess.setup.recipe = carried["recipe"]
    sess.setup.given = unpack(carried["given"])
