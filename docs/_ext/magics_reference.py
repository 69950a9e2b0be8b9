"""The ``%distrain`` reference page, written at build time from the magics' own parsers.

Each command's usage text is the one its argparse parser prints (the parsers registered in
``workbench/notebook/commands/``, the planner's flags under ``plan``, ``%%distrain``'s in
``workbench/notebook/magics.py``), so the page cannot drift from what the magic accepts.
"""

from __future__ import annotations

import importlib
import pathlib
import pkgutil

PAGE = "api/magics.md"

INTRO = """\
# `%distrain` reference

Generated from the magics' own argument parsers when the site is built: what each
command accepts is exactly what is printed here. What each word and flag means, once for
every command, is [the grammar](../grammar.md). A bad argument is refused with one line of
what was wrong and this usage, and nothing runs. Every flag is also walked by the suite's
`tests/ranks/test_flag_walk.py`. The Python calls behind each magic are in
[the Python API](workbench.md).
"""


def _usage(parser, prog: str) -> str:
    parser.prog = prog
    return parser.format_help().strip()


def magics_page() -> str:
    """The Markdown of the reference page."""
    from workbench.notebook import commands, magics

    for module in pkgutil.iter_modules(commands.__path__):
        importlib.import_module(f"{commands.__name__}.{module.name}")

    parts = [INTRO, "## `%%distrain` (a cell on the ranks)\n"]
    parts.append("```text\n" + magics.CELL.format_help().strip() + "\n```\n")
    for name in sorted(commands.COMMANDS):
        command = commands.COMMANDS[name]
        parts.append(f"## `%distrain {name}`\n\n{command.help}\n")
        for words, parser in command.parsers().items():
            parts.append("```text\n" + _usage(parser, f"%distrain {words}") + "\n```\n")
    return "\n".join(parts)


def write(srcdir: pathlib.Path) -> pathlib.Path:
    path = srcdir / PAGE
    text = magics_page()
    if not path.is_file() or path.read_text() != text:  # unchanged: Sphinx need not re-read it
        path.write_text(text)
    return path


def setup(app):
    app.connect("builder-inited", lambda app: write(pathlib.Path(app.srcdir)))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
