"""The ``%distrain`` grammar page (docs/grammar.md) holds the parsers, as torchtitan's
``test_no_new_cli_options`` freezes its command line.

Every parser is walked (each command's and action's, ``%%distrain``'s, the planner's): a
command, action or flag the page does not list, or one it lists that is not there, fails; so
does a flag name in two rows, a flag two commands take that was not built from one definition,
a text of the project that names ``%distrain WORD ...`` that does not exist, and an earlier
spelling (the page's last table) that is not refused naming its new form.
"""

from __future__ import annotations

import importlib
import json
import pathlib
import re

import pytest

from workbench.notebook import magics
from workbench.notebook.commands import COMMANDS, UsageError, load_all
from workbench.planner.arguments import _parser as planner_parser

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "grammar.md"
CELL = "%%distrain"

load_all()


# ------------------------------------------------------------------ the page
def tables(text: str) -> dict[str, list[list[str]]]:
    """heading -> rows of the table under it (each row: its cells, stripped)."""
    out: dict[str, list[list[str]]] = {}
    heading = None
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif line.startswith("|") and heading is not None:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if set("".join(cells)) <= set("-: "):
                continue  # the |---| line
            out.setdefault(heading, []).append(cells)
    return {h: rows[1:] for h, rows in out.items()}  # without the header row


def ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


class Page:
    def __init__(self, text: str) -> None:
        t = tables(text)
        self.commands = {ticked(row[0])[0]: row for row in t["Commands"]}
        self.actions = {ticked(row[0])[0] for row in t["Actions"]}
        self.flag_rows: list[tuple[str, str, list[str]]] = []  # (flag, meaning, words that take it)
        for heading in ("Flags", "The planner's flags"):
            for row in t[heading]:
                self.flag_rows.append((ticked(row[0])[0].split()[0], row[1], ticked(row[2])))
        self.earlier = [(ticked(row[0]), row[1]) for row in t["Earlier spellings"]]

    def flags(self) -> dict[str, tuple[str, list[str]]]:
        return {flag: (meaning, words) for flag, meaning, words in self.flag_rows}


def page(text: str | None = None) -> Page:
    return Page(PAGE.read_text() if text is None else text)


# ------------------------------------------------------------------ the parsers
def parsers() -> dict[str, list]:
    """words that reach a parser (``start``, ``ckpt save``, ``%%distrain``) -> its parsers."""
    out = {words: [p] for cmd in COMMANDS.values() for words, p in cmd.parsers().items()}
    out[CELL] = [magics.CELL]
    out["plan"].append(planner_parser())
    return out


def flag_actions(walked: dict[str, list]) -> dict[str, list[tuple[str, object]]]:
    """grammar name of a flag -> (words, action) for every parser that takes it."""
    out: dict[str, list] = {}
    for words, ps in walked.items():
        seen = set()
        for p in ps:
            for action in p._actions:
                if not action.option_strings or id(action) in seen:
                    continue
                seen.add(id(action))
                assert getattr(action, "grammar", None), f"{words}: {action.option_strings} carries no grammar name"
                out.setdefault(action.grammar, []).append((words, action))
    return out


def problems_a(pg: Page, walked: dict[str, list]) -> list[str]:
    """(a) commands, actions and flags: the parsers' and the page's are the same."""
    out = []
    have = set(COMMANDS) | {"help"}
    out += [f"command `{c}` is not on the grammar page" for c in sorted(have - set(pg.commands))]
    out += [f"the grammar page names command `{c}`, which is not there" for c in sorted(set(pg.commands) - have)]
    for name, row in pg.commands.items():
        module = ticked(row[2])[0] if len(row) > 2 and ticked(row[2]) else ""
        if name in COMMANDS:
            where = COMMANDS[name].handler.__module__
            if where != f"workbench.notebook.commands.{module.removesuffix('.py')}":
                out.append(f"`{name}` lives in {where}, the page says {module}")
        elif name == "help" and module != "registry.py":
            out.append(f"`help` lives in commands/registry.py, the page says {module}")
    acts = {w for w in walked if " " in w}
    out += [f"action `{a}` is not on the grammar page" for a in sorted(acts - pg.actions)]
    out += [f"the grammar page names action `{a}`, which is not there" for a in sorted(pg.actions - acts)]
    rows = pg.flags()
    taken = flag_actions(walked)
    for flag, uses in sorted(taken.items()):
        if flag not in rows:
            out.append(f"flag `{flag}` ({', '.join(sorted({w for w, _ in uses}))}) is not on the grammar page")
            continue
        meaning, listed = rows[flag]
        words = {w for w, _ in uses}
        out += [f"`{w}` takes `{flag}`; the page's row does not list it" for w in sorted(words - set(listed))]
        out += [f"the page says `{w}` takes `{flag}`; it does not" for w in sorted(set(listed) - words)]
        for _, action in uses:
            for alias in set(action.option_strings) - {flag}:
                if f"`{alias}`" not in meaning:
                    out.append(f"`{flag}` is also spelled `{alias}`; the page's row does not say so")
    out += [f"the grammar page names flag `{f}`, which no parser takes" for f in sorted(set(rows) - set(taken))]
    return sorted(set(out))


def problems_b(pg: Page, walked: dict[str, list]) -> list[str]:
    """(b) one meaning per flag name: one row each, one definition where several commands take it."""
    out = []
    names = [flag for flag, _, _ in pg.flag_rows]
    out += [f"`{f}` has {names.count(f)} rows on the grammar page" for f in sorted(set(names)) if names.count(f) > 1]
    for flag, uses in sorted(flag_actions(walked).items()):
        commands = {w for w, _ in uses}
        if len(commands) < 2:
            continue
        defs = {getattr(a, "definition", None) for _, a in uses}
        if None in defs or len(defs) > 1:
            own = sorted(w for w, a in uses if getattr(a, "definition", None) is None)
            out.append(
                f"`{flag}` is taken by {', '.join(sorted(commands))} but not built from one definition in "
                f"commands/flags.py (own: {', '.join(own) or 'two definitions'})"
            )
    return out


# ------------------------------------------------------------------ what the project's texts name
PLACEHOLDER = re.compile(r"^([A-Z][A-Z_,]*|\[.*|\{.*|<.*|\.\.\.|…)$")
FLAG = re.compile(r"^(--?[a-zA-Z][\w-]*)")
PROSE = {"magic", "magics"}  # "the %distrain magics": the magic itself, not a command
MENTION = re.compile(r"(%%?)distrain(?= )")
END = re.compile(r"[`\"'\n<]|\\n")


def sources() -> dict[str, str]:
    """Each text a user reads: code (help, messages, docstrings), docs, README, notebooks, examples."""
    out = {}
    files = [*ROOT.glob("workbench/**/*.py"), *ROOT.glob("examples/**/*.py"), *ROOT.glob("benchmarks/*.py")]
    files += [*ROOT.glob("docs/**/*.md"), *ROOT.glob("benchmarks/*.md"), ROOT / "README.md"]
    files += [*ROOT.glob("extensions/src/*.ts")]  # the Lab sidebar's texts
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if "/_build/" in rel or rel == "docs/api/magics.md":  # built from the parsers
            continue
        out[rel] = path.read_text()
    for path in ROOT.glob("notebooks/*.ipynb"):
        cells = json.loads(path.read_text())["cells"]
        for i, cell in enumerate(cells):
            out[f"{path.relative_to(ROOT).as_posix()}#cell{i}"] = "".join(cell["source"])
    return out


def _flags_of(walked, words) -> set[str]:
    return {o for p in walked.get(words, []) for a in p._actions for o in a.option_strings} | {"-h", "--help"}


def _positionals(walked, words) -> bool:
    return any(not a.option_strings for p in walked.get(words, []) for a in p._actions)


def check_words(walked: dict[str, list], tokens: list[str], cell: bool = False) -> str | None:
    """What is wrong with ``%distrain TOKENS`` (``%%distrain TOKENS`` with ``cell``), or None."""
    if cell:
        words = [CELL]
    else:
        tokens = [t.replace("\\|", "|") for t in tokens]  # a pipe escaped in a Markdown table
        name = re.split(r"[<)]", tokens[0])[0].rstrip(".,;:") if tokens else ""
        if not name or PLACEHOLDER.match(name) or name in ("help", "-h", "--help") or name in PROSE:
            return None
        if name not in COMMANDS:
            return f"`{name}` is not a command"
        words = [name]
        cmd = COMMANDS[name]
        if cmd.actions and len(tokens) > 1 and not FLAG.match(tokens[1]) and not PLACEHOLDER.match(tokens[1]):
            acts = [a for a in tokens[1].strip(".,;:)").split("|") if a and not PLACEHOLDER.match(a)]
            bad = [a for a in acts if a not in cmd.actions]
            if bad:
                return f"`{name} {bad[0]}` is not an action"
            if len(acts) == 1:
                words = [f"{name} {acts[0]}"]
            else:
                words = [f"{name} {a}" for a in acts]
        elif cmd.actions:
            words = list(cmd.parsers())
    takes = set().union(*(_flags_of(walked, w) for w in words))
    after = tokens[len(words[0].split()) :] if len(words) == 1 and not cell else []
    if after and re.match(r"^([a-zA-Z][\w.-]*|\$?\{[^}]*\})$", after[0]) and not _positionals(walked, words[0]):
        return f"`{words[0]}` takes no `{after[0]}` (a word without a flag)"
    for token in tokens if cell else tokens[1:]:
        m = FLAG.match(token.strip("[("))
        if m and m.group(1) not in takes:
            return f"`{' '.join(words[:1])}` takes no `{m.group(1)}`"
    return None


def mentions(text: str):
    """(line number, ``%``/``%%``, tokens) of each ``%distrain ...`` in ``text``, up to the end of
    its span (a backtick, a quote, the line's end)."""
    for m in MENTION.finditer(text):
        rest = text[m.end() :]
        end = END.search(rest)
        span = rest[: end.start() if end else len(rest)]
        yield text.count("\n", 0, m.start()) + 1, m.group(1), span.split()


def ticked_commands(text: str):
    """(line number, tokens) of each backticked span that starts with a command and an action or a
    flag (`` `ckpt save --async` ``, `` `where --timeout S` ``); not one a refusal names (``is now``)."""
    for m in re.finditer(r"`+([^`\n]+)`+", text):
        tokens = m.group(1).split()
        if len(tokens) < 2 or tokens[0] not in COMMANDS:
            continue
        cmd = COMMANDS[tokens[0]]
        if not (FLAG.match(tokens[1]) or (cmd.actions and re.match(r"^[a-z]+$", tokens[1]))):
            continue
        line_end = text.find("\n", m.end())
        if " is now " in text[m.end() : line_end if line_end >= 0 else len(text)][:12]:
            continue  # the refusal of an earlier spelling names it
        yield text.count("\n", 0, m.start()) + 1, tokens


def problems_c(walked: dict[str, list], texts: dict[str, str]) -> list[str]:
    """(c) every ``%distrain WORD ...`` a text names exists, with each flag it gives."""
    out = []
    for where, text in texts.items():
        if where == "docs/grammar.md":
            text = text.split("## Earlier spellings")[0]  # the table of what is refused
        for line, kind, tokens in mentions(text):
            why = check_words(walked, tokens, cell=kind == "%%")
            if why:
                out.append(f"{where}:{line}: {kind}distrain {' '.join(tokens)[:60]}: {why}")
        for line, tokens in ticked_commands(text):
            why = check_words(walked, tokens)
            if why:
                out.append(f"{where}:{line}: `{' '.join(tokens)[:60]}`: {why}")
    return out


# ------------------------------------------------------------------ the tests
def test_commands_actions_and_flags_are_the_pages():
    problems = problems_a(page(), parsers())
    assert not problems, "\n".join(problems)


def test_one_meaning_per_flag_name():
    problems = problems_b(page(), parsers())
    assert not problems, "\n".join(problems)


def test_texts_name_only_commands_and_flags_that_exist():
    problems = problems_c(parsers(), sources())
    assert not problems, f"{len(problems)} mentions of what is not there:\n" + "\n".join(problems)


SAMPLES = {"NAME": "ddp", "S": "5", "VAR": "net", "SIZE": "tiny", "PATH": "out", "N": "1", "A,B": "a,b"}


def earlier_cases(pg: Page) -> list[tuple[str, list[str]]]:
    """(a line of an earlier surface, what its refusal must name) for each spelling of the last table.

    A row's new forms pair with its old ones in order (or all with each); their words less the
    placeholders (NAME, [WHICH]) must be in the message."""
    cases = []
    for olds, now in pg.earlier:
        news = ticked(now) or [now]
        for i, old in enumerate(olds):
            new = news[i] if len(news) == len(olds) else None
            wanted = [new] if new else news
            words = [SAMPLES.get(w, w) for w in old.split()]
            names = [" ".join(w for w in n.split() if not PLACEHOLDER.match(w)) for n in wanted]
            cases.append((" ".join(words), [n for n in names if n]))
    return cases


def refusal(ip, line: str) -> Exception | None:
    """Run ``line`` (``%%distrain ...`` as a cell) in the shell; the error it raised, if any."""
    try:
        if line.startswith(CELL):
            ip.run_cell_magic("distrain", line.removeprefix(CELL).strip(), "ran_anyway = 1\n")
        else:
            ip.run_line_magic("distrain", line)
    except Exception as exc:
        return exc
    return None


def test_earlier_spellings_are_refused_naming_the_new_form(ipshell):
    from workbench.notebook import session

    pg = page()
    cases = earlier_cases(pg)
    assert len(cases) >= len(pg.earlier) >= 14
    kinds = [k for k in COMMANDS["track"].earlier_actions]
    cases += [(f"track {k}", [f"track start {k}"]) for k in kinds]  # "and the other kinds"
    before = (dict(session.KERNEL.by_name), session.KERNEL.current_name, set(ipshell.user_ns))
    for line, names in cases:
        err = refusal(ipshell, line)
        assert isinstance(err, UsageError), f"`{line}` was not refused: {err!r}"
        message = str(err)
        assert "\n" not in message and "nothing was run" in message, message
        for name in names:
            assert name in message, f"`{line}`: {message!r} does not name `{name}`"
    assert (dict(session.KERNEL.by_name), session.KERNEL.current_name, set(ipshell.user_ns)) == before


def test_earlier_python_keywords_are_refused_naming_the_new_one():
    import workbench
    from workbench.notebook import checkpoints, metrics

    calls = [
        (lambda: workbench.start(2, name="ddp"), "workbench.start(session=...)"),
        (lambda: workbench.start(2, timeout=5), "workbench.start(collective_timeout=...)"),
        (lambda: workbench.stop(name="ddp"), "workbench.stop(session=...)"),
        (lambda: workbench.restart(timeout=5), "workbench.restart(collective_timeout=...)"),
        (lambda: workbench.run("x = 1", on="ddp"), "workbench.run(session=...)"),
        (lambda: workbench.use(name="ddp"), "workbench.use(session=...)"),
        (lambda: workbench.detach(name="ddp"), "workbench.detach(session=...)"),
        (lambda: workbench.attach(name="ddp"), "workbench.attach(session=...)"),
        (lambda: workbench.dashboard(sessions=["a", "b"]), "workbench.dashboard(session=...)"),
        (lambda: metrics.metrics(sessions="all"), "workbench.metrics(session=...)"),
        (lambda: checkpoints.resume(), "workbench.restart(n, load="),
    ]
    for call, new in calls:
        with pytest.raises(TypeError) as err:
            call()
        assert new in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        workbench.start(2, bogus=1)


def test_saves_default_to_returning_once_written():
    """`ckpt save` and `ckpt autosave` (and their Python calls) are synchronous unless asked."""
    import inspect

    from workbench.notebook import checkpoints

    for fn in (checkpoints.save, checkpoints.autosave):
        assert inspect.signature(fn).parameters["async_"].default is False, fn
    for words in ("ckpt save", "ckpt autosave"):
        args = COMMANDS["ckpt"].actions[words.split()[1]].parse_args(["--every", "2"] if "auto" in words else [])
        assert args.async_ is False, words


def test_every_command_module_is_named_after_its_command():
    names = {p.stem for p in (ROOT / "workbench/notebook/commands").glob("*.py")} - {"__init__", "flags", "registry"}
    assert names == set(COMMANDS), names ^ set(COMMANDS)
    for name in COMMANDS:
        importlib.import_module(f"workbench.notebook.commands.{name}")
