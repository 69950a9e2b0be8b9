"""``.gitignore`` rules, as git reads them, for what a synced folder leaves out.

Each folder's ``.gitignore`` applies below that folder; the last rule that matches wins, a
deeper file's rules after a shallower one's; ``!`` takes a path back in; a rule ending in
``/`` names folders only; one with a ``/`` elsewhere is anchored to its file's folder. As in
git, nothing below an ignored folder can be taken back in (the walk does not enter it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    pattern: str
    regex: re.Pattern
    negate: bool
    dir_only: bool


def _class(pattern: str, i: int) -> tuple[str, int]:
    """A ``[...]`` at ``i`` as a regex class, and the index after it (a lone ``[`` is literal)."""
    j = i + 1
    if j < len(pattern) and pattern[j] in "!^":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    while j < len(pattern) and pattern[j] != "]":
        j += 1
    if j >= len(pattern):
        return re.escape("["), i + 1
    body = pattern[i + 1 : j]
    if body[:1] in ("!", "^"):
        body = "^" + body[1:]
    return "[" + body.replace("\\", "\\\\") + "]", j + 1


def translate(pattern: str) -> str:
    """A gitignore glob (already without ``!``, trailing ``/`` and a leading ``/``) -> a regex
    matched against a path relative to the rule's folder."""
    out = []
    i = 0
    n = len(pattern)
    while i < n:
        if pattern.startswith("**/", i) and (i == 0 or pattern[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i) and i + 2 == n and (i == 0 or pattern[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            while i < n and pattern[i] == "*":
                i += 1
            out.append("[^/]*")
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            part, i = _class(pattern, i)
            out.append(part)
        elif pattern[i] == "\\" and i + 1 < n:
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return "".join(out)


def parse(text: str) -> list[Rule]:
    """The rules of one ``.gitignore`` file's text."""
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip("\n\r")
        while line.endswith(" ") and not line.endswith("\\ "):
            line = line[:-1]
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate:
            line = line[1:]
        elif line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        body = translate(line.lstrip("/"))
        regex = re.compile(("" if anchored else "(?:.*/)?") + body + r"\Z", re.DOTALL)
        rules.append(Rule(raw.strip(), regex, negate, dir_only))
    return rules


class Ignored:
    """The rules in force at one place of a walk: each folder's ``.gitignore`` on the way down."""

    def __init__(self, layers: tuple[tuple[str, tuple[Rule, ...]], ...] = ()):
        self.layers = layers  # (folder relative to the root, '' for the root; its rules), root first

    def below(self, folder: str, text: str | None) -> Ignored:
        """The rules in ``folder`` (relative to the root), with its own ``.gitignore`` text if any."""
        if not text:
            return self
        rules = tuple(parse(text))
        return Ignored((*self.layers, (folder, rules))) if rules else self

    def __call__(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` (relative to the root, ``/``-separated) is left out."""
        ignored = False
        for folder, rules in self.layers:
            if folder:
                if not path.startswith(folder + "/"):
                    continue
                sub = path[len(folder) + 1 :]
            else:
                sub = path
            for rule in rules:
                if rule.dir_only and not is_dir:
                    continue
                if rule.regex.match(sub):
                    ignored = not rule.negate
        return ignored
