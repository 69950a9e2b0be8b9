"""The one crossing (docs/architecture.md, "The crossing"): the notebook side reaches a rank only
through ``workbench.engine.rpc``, so that reading that file tells the whole protocol. Read from
the source (each module's syntax tree), nothing imported or started:

- a notebook-side module (workbench/notebook, workbench/labserver) imports nothing of
  ``workbench.engine`` but ``rpc``;
- what it sends to ranks (``apply``, ``apply_async``, ``apply_sync``, ``submit``) is
  ``rpc.handle`` with a request, except where a caller's own function is passed on
  (``api.apply``: the users' way to run their function on the ranks);
- it sends no code it wrote itself as a cell, and pushes no variables of its own.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SIDES = ("workbench/notebook", "workbench/labserver")
SENDS = {"apply", "apply_async", "apply_sync", "submit"}
RUNS_CODE = {"execute", "execute_async", "run", "run_cell"}  # their code argument: a cell's text

# (module, engine module it imports) -> why that is no call on a rank
LAUNCHES = {
    ("workbench/notebook/cluster/ray_launcher.py", "workbench.engine.ray_actor"): (
        "Ray places this actor class; it starts the guarded engine as srun or ssh do"
    ),
}

# (module, function) whose send passes on a function it was given, or is no send to ranks at all
PASSES_ON = {
    ("workbench/notebook/api.py", "apply"): "the user's own function (workbench.apply)",
    ("workbench/notebook/cluster/rankset.py", "RankSet.submit"): "its caller's function, to a view",
    ("workbench/notebook/cluster/rankset.py", "RankSet.apply"): "its caller's function, to submit",
    ("workbench/notebook/cluster/fanout.py", "submit"): "its caller's function, wrapped in rpc.fanned",
    ("workbench/labserver/monitor.py", "Controllers.call"): "a thread pool of the Lab server",
    ("workbench/labserver/monitor.py", "Controllers.forget"): "a thread pool of the Lab server",
    ("workbench/notebook/cluster/lighthouse.py", "_spawn"): "a thread pool of the notebook",
}


def _modules() -> list[Path]:
    return sorted(p for side in SIDES for p in (ROOT / side).rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _package(path: Path) -> list[str]:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return parts if path.name == "__init__.py" else parts[:-1]


def _imported(path: Path, tree: ast.AST) -> list[tuple[int, str]]:
    """Every module name the file imports, resolved (``from ...engine import rpc``:
    ``workbench.engine.rpc``), with its line."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            pkg = _package(path)
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            out += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return out


def _engine_import(name: str) -> str | None:
    """The engine module an imported name reaches (``workbench.engine.rpc.handle`` -> its module)."""
    if name != "workbench.engine" and not name.startswith("workbench.engine."):
        return None
    parts = name.split(".")
    return ".".join(parts[:3])


class _Calls(ast.NodeVisitor):
    """Calls with the function that holds them (``RankSet.submit``)."""

    def __init__(self):
        self.scope: list[str] = []
        self.found: list[tuple[str, ast.Call]] = []

    def _scoped(self, node):
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call):
        self.found.append((".".join(self.scope), node))
        self.generic_visit(node)


def _written_code(node: ast.AST) -> bool:
    """Text the notebook's own code builds: a literal, an f-string, or one joined or formatted."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp):
        return _written_code(node.left) or _written_code(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("format", "join"):
        return _written_code(node.func.value)
    return False


def _name(node: ast.AST) -> str:
    return node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")


def problems(path: Path, source: str) -> list[str]:
    """Where one notebook-side module crosses to the ranks other than through ``rpc``."""
    rel, tree, out = _rel(path), ast.parse(source), []
    for line, name in _imported(path, tree):
        engine = _engine_import(name)
        if engine and engine != "workbench.engine.rpc" and (rel, engine) not in LAUNCHES:
            out.append(f"{rel}:{line} imports {name}: the notebook reaches a rank only through workbench.engine.rpc")
    calls = _Calls()
    calls.visit(tree)
    for scope, call in calls.found:
        what, where = _name(call), f"{rel}:{call.lineno} ({scope or 'module'})"
        if what in SENDS and call.args and isinstance(call.func, ast.Attribute):
            first = ast.unparse(call.args[0])
            if first != "rpc.handle" and (rel, scope) not in PASSES_ON:
                out.append(f"{where} sends {first} to ranks: send rpc.handle with a request of workbench.engine.rpc")
        code = call.args[1] if what == "run_cell" and len(call.args) > 1 else call.args[0] if call.args else None
        if what in RUNS_CODE and code is not None and _written_code(code):
            out.append(f"{where} runs code it wrote as a cell on ranks: make it a request of workbench.engine.rpc")
        if what == "push" and call.args and isinstance(call.args[0], ast.Dict):
            out.append(f"{where} pushes variables of its own to ranks: pass them in a request of workbench.engine.rpc")
    return out


def test_the_notebook_reaches_ranks_only_through_rpc():
    found = [p for path in _modules() for p in problems(path, path.read_text())]
    assert not found, "\n".join(found)


def test_every_exception_names_a_place_that_exists():
    """A launch or a pass-on allowed for a module or function that is no longer there is stale."""
    present = {_rel(p): p for p in _modules()}
    for rel, engine in LAUNCHES:
        assert rel in present and any(
            _engine_import(n) == engine for _, n in _imported(present[rel], ast.parse(present[rel].read_text()))
        )
    for rel, scope in PASSES_ON:
        calls = _Calls()
        calls.visit(ast.parse(present[rel].read_text()))
        assert any(s == scope and _name(c) in SENDS for s, c in calls.found), (rel, scope)


@pytest.mark.parametrize(
    "snippet, says",
    [
        ("from ...engine import runtime\n", "imports workbench.engine.runtime"),
        ("from ...engine.preload import READY\n", "imports workbench.engine.preload.READY"),
        ("import workbench.engine.control as c\n", "imports workbench.engine.control"),
        ("from ...engine import rpc, publisher\n", "imports workbench.engine.publisher"),
        ("def f(rs):\n    rs.apply(runtime.leave_group, ranks=[0])\n", "sends runtime.leave_group"),
        ("def f(rs, fn):\n    rs.submit(fn)\n", "sends fn"),
        ("def f(client):\n    client[0].apply_async(lambda: 1)\n", "sends lambda: 1"),
        ("def f(rs):\n    rs.execute('import os')\n", "runs code it wrote"),
        ("def f(api, m):\n    api.run(f'x = {m}')\n", "runs code it wrote"),
        ("def f(rs, s):\n    rs.push({'_spec': s})\n", "pushes variables of its own"),
    ],
)
def test_each_way_around_rpc_is_named(snippet, says):
    """What the check catches, on one module of the notebook side."""
    found = problems(ROOT / "workbench/notebook/cluster/stragglers.py", snippet)
    assert len(found) == 1 and says in found[0], found


@pytest.mark.parametrize(
    "snippet",
    [
        "from ...engine import rpc\n",
        "from ...engine.rpc import handle\n",
        "def f(rs):\n    rs.apply(rpc.handle, rpc.LeaveGroup(), ranks=[0])\n",
        "def f(rs, code):\n    rs.execute(code)\n",  # the user's cell
        "def f(api, ns):\n    api.push({n: ns[n] for n in ns})\n",  # the user's variables
    ],
)
def test_the_one_way_passes(snippet):
    assert problems(ROOT / "workbench/notebook/cluster/stragglers.py", snippet) == []


def test_every_request_is_a_frozen_dataclass_with_a_rank_side_half():
    """rpc.py holds two entry points and requests: frozen dataclasses whose ``run`` is the rank's half."""
    tree = ast.parse((ROOT / "workbench/engine/rpc.py").read_text())
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions == ["handle", "fanned"]
    for node in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        frozen = [
            d
            for d in node.decorator_list
            if isinstance(d, ast.Call)
            and getattr(d.func, "id", "") == "dataclass"
            and any(k.arg == "frozen" and getattr(k.value, "value", False) is True for k in d.keywords)
        ]
        runs = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
        assert frozen and runs, f"rpc.{node.name}: a request is @dataclass(frozen=True) with a run()"
