"""The student version of a lab: each solution region becomes a marked blank (notebook side).

Instructor notebooks use nbgrader's markers: a code cell tagged ``solution`` holds
``### BEGIN SOLUTION`` / ``### END SOLUTION`` around the answer; check cells are tagged
``tests`` and stay as they are. A blanked cell still runs, so the check after it can say
what is missing."""

from __future__ import annotations

import ast
import copy
import dataclasses
import re
import textwrap

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
SOLUTION_TAG = "solution"
TESTS_TAG = "tests"
ANSWER_HERE = "# YOUR ANSWER HERE"
CODE_HERE = "# YOUR CODE HERE"


class LabFormatError(ValueError):
    """An instructor notebook whose solution markers or tags do not agree."""


@dataclasses.dataclass(frozen=True)
class Blank:
    cell: int  # index of the cell in the notebook
    kind: str  # "value" (names set to ...) or "code" (NotImplementedError)
    names: tuple[str, ...]  # the assigned names of a value blank
    exercise: str  # the NotImplementedError text of a code blank


def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _regions(source: str, where: str) -> list[tuple[int, int]]:
    """(begin line, end line) of each solution region, by line index."""
    lines = source.split("\n")
    out, start = [], None
    for i, line in enumerate(lines):
        s = line.strip()
        if s == BEGIN:
            if start is not None:
                raise LabFormatError(
                    f"{where}: {BEGIN} at line {i + 1} inside another region (opened at line {start + 1})"
                )
            start = i
        elif s == END:
            if start is None:
                raise LabFormatError(f"{where}: {END} at line {i + 1} without {BEGIN}")
            out.append((start, i))
            start = None
        elif BEGIN in line or END in line:
            raise LabFormatError(
                f"{where}: line {i + 1} holds a solution marker beside other text; "
                f"put {BEGIN!r} / {END!r} on lines of their own"
            )
    if start is not None:
        raise LabFormatError(f"{where}: {BEGIN} at line {start + 1} has no {END}")
    return out


def _assigned_names(body: str) -> tuple[str, ...] | None:
    """The names a region only assigns (``a = ...``; ``a, b = ...``), or None for other code."""
    try:
        tree = ast.parse(textwrap.dedent(body))
    except SyntaxError:
        return None
    names: list[str] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets = [stmt.target]
        else:
            return None
        for t in targets:
            elts = t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]
            if not all(isinstance(e, ast.Name) for e in elts):
                return None
            names.extend(e.id for e in elts)
    return tuple(dict.fromkeys(names)) or None


def _exercise(body_lines: list[str]) -> str:
    first = next((ln.strip() for ln in body_lines if ln.strip()), "")
    if first.startswith("#"):
        return first.lstrip("#").strip()
    return "write the code of this step"


def blank_cell(source: str, where: str) -> tuple[str, list[tuple[str, tuple[str, ...], str]]]:
    """The cell source with every region blanked, and (kind, names, exercise) per region.

    A region made only of assignments (``my_dim = 1``) becomes ``my_dim = ...  # YOUR ANSWER
    HERE`` for each name; any other becomes nbgrader's ``# YOUR CODE HERE`` and ``raise
    NotImplementedError("exercise: ...")``, the exercise taken from its first line's comment."""
    lines = source.split("\n")
    regions = _regions(source, where)
    if not regions:
        raise LabFormatError(f"{where}: tagged {SOLUTION_TAG!r} but has no {BEGIN} / {END} region")
    out: list[str] = []
    made = []
    pos = 0
    for start, end in regions:
        out.extend(lines[pos:start])
        indent = lines[start][: len(lines[start]) - len(lines[start].lstrip())]
        body = lines[start + 1 : end]
        if not any(ln.strip() for ln in body):
            raise LabFormatError(f"{where}: the solution region at line {start + 1} is empty")
        names = _assigned_names("\n".join(body))
        if names is not None:
            out.extend(f"{indent}{name} = ...  {ANSWER_HERE}" for name in names)
            made.append(("value", names, ""))
        else:
            text = _exercise(body)
            out.append(f"{indent}{CODE_HERE}")
            out.append(f"{indent}raise NotImplementedError({('exercise: ' + text)!r})")
            made.append(("code", (), text))
        pos = end + 1
    out.extend(lines[pos:])
    return "\n".join(out), made


def _cleared(cell) -> None:
    if cell.cell_type == "code":
        cell.outputs = []
        cell.execution_count = None
    cell.get("metadata", {}).pop("execution", None)


def validate(nb, name: str) -> None:
    """Markers only in cells tagged ``solution``, and every such cell has a region."""
    for i, cell in enumerate(nb.cells):
        where = f"{name} cell {i}"
        has = BEGIN in cell.source or END in cell.source
        tagged = SOLUTION_TAG in tags(cell)
        if has and not tagged:
            raise LabFormatError(
                f"{where}: has solution markers but is not tagged {SOLUTION_TAG!r} (add it to the cell's metadata.tags)"
            )
        if tagged and cell.cell_type != "code":
            raise LabFormatError(f"{where}: only code cells can be tagged {SOLUTION_TAG!r}")
        if tagged:
            _regions(cell.source, where)


def instructor_version(nb, name: str = "notebook"):
    """The instructor notebook as handed out: solutions kept, outputs cleared."""
    validate(nb, name)
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        _cleared(cell)
    return nb


def student_version(nb, name: str = "notebook"):
    """(student notebook, blanks): solution regions replaced by marked blanks, outputs cleared."""
    nb = instructor_version(nb, name)
    blanks: list[Blank] = []
    for i, cell in enumerate(nb.cells):
        if SOLUTION_TAG not in tags(cell):
            continue
        cell.source, made = blank_cell(cell.source, f"{name} cell {i}")
        blanks.extend(Blank(i, kind, names, text) for kind, names, text in made)
    return nb, blanks


_CHECK_CALL = re.compile(r"""workbench\.labs\.check\(\s*["']([^"']+)["']""")


def check_names(source: str) -> list[str]:
    """The checker names a cell calls ``workbench.labs.check`` with."""
    return _CHECK_CALL.findall(source)
