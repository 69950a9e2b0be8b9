"""``%distrain`` commands: a name registry of small argparse commands (docs/grammar.md).

Each command lives in the module named after it and registers itself here; an action
(``ckpt save``) has a parser of its own, and a flag two commands take is built from one
definition (:mod:`.flags`). ``--session NAME`` is made current for the line unless the
command reads it itself. A bad argument, or an earlier spelling, raises :class:`UsageError`
with one line naming what would work, and nothing runs.
"""

from __future__ import annotations

from .registry import (
    COMMANDS,
    Command,
    CommandParser,
    UsageError,
    action_usage,
    command,
    dispatch,
    grammar_name,
    load_all,
    usage,
)

__all__ = [
    "COMMANDS",
    "Command",
    "CommandParser",
    "UsageError",
    "action_usage",
    "command",
    "dispatch",
    "grammar_name",
    "load_all",
    "usage",
]
