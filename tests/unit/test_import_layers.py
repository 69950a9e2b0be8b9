"""The house reads top-down: inside every package of ``workbench/``, its modules and
sub-packages form layers (no two import each other, however indirectly), and none of them
imports the package's own ``__init__`` (the room above it). Lazy imports inside functions
count: they tie the rooms together just the same."""

from __future__ import annotations

import ast
import pathlib

import pytest

pytestmark = pytest.mark.pure

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "workbench"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _targets(name: str, path: pathlib.Path, text: str | None = None) -> set[str]:
    """Every workbench module ``name`` imports (a ``from P import x`` names ``P.x`` when that is a module)."""
    is_pkg = path.name == "__init__.py"
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text() if text is None else text)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here[: len(here) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in MODULES else base)
    return {t for t in out if t == "workbench" or t.startswith("workbench.")}


def _resolve(target: str) -> str | None:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


EDGES = {m: {r for t in _targets(m, p) if (r := _resolve(t)) and r != m} for m, p in MODULES.items()}
PACKAGES = sorted(m for m, p in MODULES.items() if p.name == "__init__.py")


def _child(package: str, module: str) -> str | None:
    """The room of ``package`` that ``module`` lives in (a module or a sub-package), or None."""
    if not module.startswith(package + "."):
        return None
    return package + "." + module[len(package) + 1 :].split(".")[0]


def _rooms(package: str) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for module, targets in EDGES.items():
        src = _child(package, module)
        if src is None:
            continue
        rooms.setdefault(src, set())
        rooms[src] |= {dst for t in targets if (dst := _child(package, t)) and dst != src}
    return rooms


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_the_rooms_of_each_package_form_layers(package):
    cycle = _cycle(_rooms(package))
    assert cycle is None, f"inside {package}, these import each other in a circle: {' -> '.join(cycle)}"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_the_package_above_it(package):
    upward = sorted(m for m, targets in EDGES.items() if package in targets and m.startswith(package + "."))
    assert not upward, (
        f"{', '.join(upward)} import {package}'s __init__, the room above them: import the module that holds the name"
    )


def test_the_check_sees_a_circle_and_an_upward_import():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    # the runs package holds its part in part.py; a kind importing the package's __init__ is seen
    src = "from . import begin\n"
    path = PACKAGE / "notebook" / "runs" / "budget.py"
    assert "workbench.notebook.runs" in _targets("workbench.notebook.runs.budget", path, src)
