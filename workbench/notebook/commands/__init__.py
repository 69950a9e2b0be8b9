"""``%distrain`` sub-commands: a name registry of small argparse commands.

Each area of the workbench registers its own sub-commands (``ranks``, and later
training, checkpoints, planning) in a module of this package; the magic only looks
them up. A bad argument raises :class:`UsageError` with one line of what was wrong
and the usage, and nothing is run.
"""
from __future__ import annotations

import argparse
import shlex
from dataclasses import dataclass
from typing import Callable

from ...shared.errors import WorkbenchError


class UsageError(WorkbenchError):
    """A sub-command got arguments it cannot use; nothing was changed."""


class CommandParser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting the kernel."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("add_help", False)
        kwargs.setdefault("exit_on_error", False)
        super().__init__(*args, **kwargs)

    def error(self, message):  # argparse calls this for every parse error
        raise UsageError(f"{message}. usage: {self.one_line_usage()}")

    def one_line_usage(self) -> str:
        return " ".join(self.format_usage().split()).removeprefix("usage: ")


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    parser: CommandParser
    handler: Callable  # handler(args, shell) -> value shown as the cell's result
    raw: bool = False  # handler gets the argument list as is (it parses them itself)


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, build: Callable[[CommandParser], None] | None = None, *,
            raw: bool = False):
    """Register ``handler(args, shell)`` as ``%distrain NAME``; ``build`` adds its arguments.

    With ``raw=True`` the handler gets the list of words instead (for sub-commands
    that hand their options on to a parser of their own, such as the planner's).
    """

    def register(handler):
        parser = CommandParser(prog=f"%distrain {name}", description=help)
        if build:
            build(parser)
        COMMANDS[name] = Command(name, help, parser, handler, raw)
        return handler

    return register


def usage() -> str:
    names = "|".join(sorted(COMMANDS))
    lines = [f"usage: %distrain {{{names}}} ..."]
    lines += [f"  {c.name:<10} {c.help}" for c in sorted(COMMANDS.values(), key=lambda c: c.name)]
    return "\n".join(lines)


def dispatch(line: str, shell=None):
    """Parse ``line`` (``start -n 4``), then run the registered handler."""
    load_all()
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"could not parse {line!r}: {exc}") from None
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return None
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        raise UsageError(f"unknown sub-command {name!r}: use one of {', '.join(sorted(COMMANDS))}")
    cmd = COMMANDS[name]
    if cmd.raw:
        return cmd.handler(rest, shell)
    if rest in (["-h"], ["--help"]):
        print(cmd.parser.format_help())
        return None
    try:
        args = cmd.parser.parse_args(rest)
    except argparse.ArgumentError as exc:
        raise UsageError(f"{exc}. usage: {cmd.parser.one_line_usage()}") from None
    return cmd.handler(args, shell)


_LOADED = False


def load_all() -> None:
    """Import the modules that register sub-commands (each area owns its own)."""
    global _LOADED
    if _LOADED:
        return
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")
    _LOADED = True
