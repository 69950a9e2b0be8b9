"""The flags two or more ``%distrain`` commands take, each defined once (docs/grammar.md).

A command adds one with ``SESSION.add(parser)``; the action it makes carries the definition
(``action.definition``), so ``tests/unit/test_grammar.py`` can tell one meaning built twice
from two meanings sharing a name. A command may give its own help or default, never its own
type, choices or form.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...shared.argtypes import positive_int, rank_selection, seconds, session_names
from ..cluster.rankset import BACKENDS
from .registry import grammar_name


@dataclass(frozen=True, eq=False)  # one definition is one object: compared by identity
class Flag:
    names: tuple[str, ...]
    options: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.names[0]

    def add(self, parser, *, help: str | None = None, default=None, required: bool = False):  # noqa: A002
        """Add this flag to ``parser``; ``help``/``default``/``required`` may be the command's own."""
        options = dict(self.options)
        if help is not None:
            options["help"] = help
        if default is not None:
            options["default"] = default
        if required:
            options["required"] = True
        action = parser.add_argument(*self.names, **options)
        action.grammar = grammar_name(action.option_strings)  # also when added to a group of the parser
        action.definition = self
        return action


SESSION = Flag(
    ("--session",),
    dict(
        type=session_names,
        default=None,
        metavar="NAME",
        help="the session the command acts on (default: the current one)",
    ),
)
RANKS = Flag(
    ("--ranks",),
    dict(type=rank_selection, default=None, help="the ranks to act on or show: 0,2-3 or all (default all)"),
)
TIMEOUT = Flag(
    ("--timeout",),
    dict(type=seconds, default=None, help="seconds to wait before saying what was seen (what runs goes on)"),
)
N = Flag(("-n",), dict(type=positive_int, default=None, help="the number of ranks"))
BACKEND = Flag(
    ("--backend",), dict(choices=BACKENDS, default=None, help="the process group's backend (auto: nccl with GPUs)")
)
COLLECTIVE_TIMEOUT = Flag(
    ("--collective-timeout",),
    dict(type=seconds, default=None, help="seconds a collective on the ranks may take before torch raises"),
)
SETUP = Flag(
    ("--setup",),
    dict(
        default=None,
        metavar="VAR",
        help="the notebook variable holding the setup code (a str run on every rank, or a function) "
        "that a restart or a recovery repeats",
    ),
)
DIR = Flag(("--dir",), dict(default=None, metavar="PATH", help="the folder the files go to or come from"))
STEPS = Flag(("--steps",), dict(type=positive_int, default=None, help="a number of training steps"))
ASYNC = Flag(
    ("--async",),
    dict(dest="async_", action="store_true", help="write in the background (default: return once written)"),
)
MODEL_ONLY = Flag(("--model-only",), dict(action="store_true", help="the model's state only, not the optimizer's"))
KEEP = Flag(("--keep",), dict(type=positive_int, default=None, metavar="K", help="keep the newest K auto-saves"))
RUN = Flag(("--run",), dict(default=None, metavar="ID", help="this run (default: the latest)"))
GROUPED = Flag(
    ("--grouped",),
    dict(dest="group", action="store_true", default=None, help="ranks with the same output or place shown once"),
)
PER_RANK = Flag(("--per-rank",), dict(dest="group", action="store_false", default=None, help="every rank on its own"))


def setup_from(name: str | None, shell):
    """The setup code (or function) in notebook variable ``name`` (``--setup VAR``); None without a name."""
    if not name:
        return None
    from .registry import UsageError

    ns = shell.user_ns if shell is not None else {}
    if name not in ns:
        raise UsageError(f"no notebook variable named {name!r}: put the setup cell's code in it")
    return ns[name]
