"""The ``%distrain`` reference page, written at build time from the magics' own parsers.

Each sub-command's usage text is the one its argparse parser prints (the parsers registered in
``workbench/notebook/commands/``, the planner's in ``workbench/planner/arguments.py`` and
``%%distrain``'s from its ``magic_arguments``), so the page cannot drift from what the magic accepts.
"""

from __future__ import annotations

import importlib
import pathlib
import pkgutil

PAGE = "api/magics.md"

INTRO = """\
# `%distrain` reference

Generated from the magics' own argument parsers when the site is built: what each
sub-command accepts is exactly what is printed here. A bad argument is refused with one
line of what was wrong and this usage, and nothing runs. Every flag is also walked by the
suite's `tests/ranks/test_flag_walk.py`. The Python calls behind each magic are in
[the Python API](workbench.md).
"""


def _usage(parser, prog: str) -> str:
    parser.prog = prog
    return parser.format_help().strip()


def magics_page() -> str:
    """The Markdown of the reference page."""
    from workbench.notebook import commands, magics
    from workbench.planner.arguments import _parser as planner_parser

    for module in pkgutil.iter_modules(commands.__path__):
        importlib.import_module(f"{commands.__name__}.{module.name}")

    parts = [INTRO, "## `%%distrain` (a cell on the ranks)\n"]
    cell = magics.DistrainMagics.distrain_cell
    usage = cell.parser.format_help().replace("%distrain_cell", "%%distrain")  # IPython names it after the method
    usage = "\n".join(line for line in usage.splitlines() if line.strip() != "::").strip()
    parts.append("```text\n" + usage + "\n```\n")
    for name in sorted(commands.COMMANDS):
        command = commands.COMMANDS[name]
        parts.append(f"## `%distrain {name}`\n\n{command.help}\n")
        parsers = command.parsers() or ({name: planner_parser()} if name == "plan" else {})
        for words, parser in parsers.items():
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
