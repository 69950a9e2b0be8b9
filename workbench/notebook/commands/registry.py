"""The registry of ``%distrain`` commands: the parser every command builds on, the ``command``
decorator each command module registers itself with, and ``dispatch``, which parses a line,
refuses an earlier spelling and runs the handler (``help`` included)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ...shared.errors import WorkbenchError


class UsageError(WorkbenchError):
    """A command got arguments it cannot use; nothing was changed."""


def grammar_name(option_strings) -> str:
    """The spelling the grammar page lists a flag under: its first long name (``--hw``, not ``--hardware``)."""
    return next((o for o in option_strings if o.startswith("--")), option_strings[0])


class CommandParser(argparse.ArgumentParser):
    """argparse that raises instead of printing and exiting the kernel, tags each flag with
    its grammar name (``action.grammar``) and refuses the earlier spellings it was told of."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("add_help", False)
        kwargs.setdefault("exit_on_error", False)
        kwargs.setdefault("allow_abbrev", False)  # `--mod` is refused, never guessed to be `--model-var`
        super().__init__(*args, **kwargs)
        self.earlier: dict[str, tuple[str | None, str]] = {}  # old flag -> (new flag or None to drop it, why)
        self.earlier_positional: str | None = None  # `use NAME` -> `use --session NAME`

    def add_argument(self, *args, **kwargs):
        if "metavar" not in kwargs and hasattr(kwargs.get("type"), "metavar"):
            kwargs["metavar"] = kwargs["type"].metavar  # `--steps N`, `--timeout S`
        action = super().add_argument(*args, **kwargs)
        if action.option_strings:
            action.grammar = grammar_name(action.option_strings)
        return action

    def was(self, old: str, new: str | None, why: str = "") -> None:
        """Refuse ``old`` (a flag of an earlier surface), naming ``new`` (None: it is dropped)."""
        self.earlier[old] = (new, why)

    def refuse_earlier(self, words: list[str]) -> None:
        """Raise naming the new form when ``words`` use an earlier spelling; nothing is parsed or run."""
        short = self.prog.removeprefix("%distrain ")  # `start`, `ckpt save`, `%%distrain`
        if self.earlier_positional and words and not words[0].startswith("-"):
            new = f"{short} {self.earlier_positional} {words[0]}"
            line = shlex.join([*self.prog.split(), self.earlier_positional, *words])
            raise UsageError(f"`{short} {words[0]}` is now `{new}`: `{line}`; nothing was run")
        for i, word in enumerate(words):
            flag, eq, value = word.partition("=")
            if flag not in self.earlier:
                continue
            new, why = self.earlier[flag]
            line = shlex.join(
                [*self.prog.split(), *words[:i], *([] if new is None else [new + eq + value]), *words[i + 1 :]]
            )
            if new is None:
                raise UsageError(f"{why}: drop `{flag}` (`{line}`); nothing was run")
            why = f" ({why})" if why else ""
            raise UsageError(f"`{short} {flag}` is now `{new}`{why}: `{line}`; nothing was run")

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
    # action -> its own parser (``ckpt save``, ``train start``): each action takes only its flags
    actions: Mapping[str, CommandParser] = field(default_factory=dict)
    # how ``--session`` reaches it: "current" (made current for the call), "own" (the handler reads
    # one name), "several" (the handler reads the names)
    session: str = "current"
    # an action of an earlier surface -> words after it -> the one-line refusal naming the new form
    earlier_actions: Mapping[str, Callable[[list[str]], str]] = field(default_factory=dict)

    def parsers(self) -> dict[str, CommandParser]:
        """Every parser of this command by the words that reach it (``ckpt save``)."""
        if self.actions:
            return {f"{self.name} {a}": p for a, p in self.actions.items()}
        return {self.name: self.parser}


COMMANDS: dict[str, Command] = {}


def command(
    name: str,
    help: str,
    build: Callable[[CommandParser], None] | None = None,
    *,
    raw: bool = False,
    actions: Mapping[str, tuple[str, Callable | None]] | None = None,
    session: str = "current",
    earlier_actions: Mapping[str, Callable[[list[str]], str]] | None = None,
):
    """Register ``handler(args, shell)`` as ``%distrain NAME``; ``build`` adds its arguments.

    With ``actions`` (``{"save": (help, build), ...}``) each action gets a parser of its
    own (``%distrain NAME ACTION [flags]``) and the handler finds the action in
    ``args.action``. With ``raw=True`` the handler gets the list of words instead (for
    a command that hands its options on to a parser of its own, such as the planner's);
    ``build`` then only describes them.
    """

    def register(handler):
        parser = CommandParser(prog=f"%distrain {name}", description=help)
        if build:
            build(parser)
        subs = {}
        for action, (sub_help, sub_build) in (actions or {}).items():
            sub = CommandParser(prog=f"%distrain {name} {action}", description=sub_help)
            if sub_build:
                sub_build(sub)
            subs[action] = sub
        COMMANDS[name] = Command(name, help, parser, handler, raw, subs, session, dict(earlier_actions or {}))
        return handler

    return register


def usage() -> str:
    """``%distrain help``: every command in one line each."""
    names = "|".join(sorted(COMMANDS))
    lines = [f"usage: %distrain {{{names}}} ...  (`%distrain NAME -h` for one)"]
    lines += [f"  {c.name:<10} {c.help}" for c in sorted(COMMANDS.values(), key=lambda c: c.name)]
    return "\n".join(lines)


def action_usage(cmd: Command) -> str:
    """``%distrain ckpt -h``: each action: its usage line, then what it does."""
    lines = [
        f"usage: %distrain {cmd.name} {{{'|'.join(cmd.actions)}}} ...  (`%distrain {cmd.name} ACTION -h` for one)",
        f"  {cmd.help}",
    ]
    for p in cmd.actions.values():
        lines += [f"  {p.one_line_usage().removeprefix('%distrain ')}", f"      {p.description}"]
    return "\n".join(lines)


def _parse(cmd: Command, parser: CommandParser, words: list[str], action: str | None = None):
    """Parse ``words``; a flag that belongs to another action is refused naming who takes it."""
    parser.refuse_earlier(words)
    try:
        args, extra = parser.parse_known_args(words)
    except argparse.ArgumentError as exc:
        raise UsageError(f"{exc}. usage: {parser.one_line_usage()}") from None
    if extra:
        flags = [w.split("=", 1)[0] for w in extra if w.startswith("-")]
        owners = {f: [a for a, p in cmd.actions.items() if f in p._option_string_actions] for f in flags}
        where = [f"{f} goes with {', '.join(o)}" for f, o in owners.items() if o]
        what = f"`{cmd.name} {action}`" if action else f"`{cmd.name}`"
        if flags and all(owners.values()):
            raise UsageError(f"{what} does not take {', '.join(flags)} ({'; '.join(where)}); nothing was done")
        hint = getattr(parser, "unknown_hint", "")
        parser.error(f"unrecognized arguments: {' '.join(extra)}{' (' + hint + ')' if hint else ''}")
    if action is not None:
        args.action = action
    return args


def _call(cmd: Command, args, shell):
    """Run the handler; ``--session NAME`` of a command that does not read it is current for the call."""
    names = getattr(args, "session", None)
    if names is None or cmd.session == "several":
        return cmd.handler(args, shell)
    if len(names) > 1:
        raise UsageError(
            f"--session {','.join(names)}: `{cmd.name}` acts on one session "
            "(`dashboard --session A,B` shows several); nothing was done"
        )
    args.session = names[0]
    if cmd.session == "own":
        return cmd.handler(args, shell)
    from .. import session

    try:
        named = session.named(args.session)
    except session.UnknownSession as exc:
        raise UsageError(str(exc)) from None
    with named:
        return cmd.handler(args, shell)


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
        raise UsageError(f"unknown command {name!r}: use one of {', '.join(sorted(COMMANDS))} (`%distrain help`)")
    cmd = COMMANDS[name]
    if cmd.raw:
        return cmd.handler(rest, shell)
    if cmd.actions:
        if not rest or rest[0] in ("-h", "--help", "help"):
            if not rest:
                raise UsageError(
                    f"`%distrain {name}` needs an action: {', '.join(cmd.actions)} "
                    f"(`%distrain {name} -h` says what each does)"
                )
            print(action_usage(cmd))
            return None
        action, rest = rest[0], rest[1:]
        if action in cmd.earlier_actions:
            raise UsageError(cmd.earlier_actions[action](rest))
        if action not in cmd.actions:
            raise UsageError(f"unknown action {action!r} for `%distrain {name}`: use one of {', '.join(cmd.actions)}")
        parser = cmd.actions[action]
        if rest in (["-h"], ["--help"]):
            print(parser.format_help())
            return None
        return _call(cmd, _parse(cmd, parser, rest, action), shell)
    if rest in (["-h"], ["--help"]):
        print(cmd.parser.format_help())
        return None
    return _call(cmd, _parse(cmd, cmd.parser, rest), shell)


_LOADED = False


def load_all() -> None:
    """Import the modules that register commands (each command's own)."""
    global _LOADED
    if _LOADED:
        return
    import importlib
    import pkgutil

    package = importlib.import_module(__package__)
    for mod in pkgutil.iter_modules(package.__path__):
        if mod.name != "registry":
            importlib.import_module(f"{__package__}.{mod.name}")
    _LOADED = True
