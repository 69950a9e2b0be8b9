"""A session's parts are changed only by the module that owns each (``workbench.notebook.session``):
every module of ``workbench/`` is parsed and each write to a part's field from another module is
counted (assignment, augmented assignment, del, setattr/delattr, an item stored or deleted, a
mutating method such as ``append`` or ``pop``); the count is zero. A part's fields are read
freely. The parts themselves cannot be replaced, nor a field made up: ``__slots__`` and
read-only properties refuse it at run time."""

from __future__ import annotations

import ast
import pathlib

import pytest

from workbench.notebook import session

pytestmark = pytest.mark.pure

ROOT = pathlib.Path(__file__).resolve().parents[2]
MUTATORS = {
    "append",
    "extend",
    "insert",
    "pop",
    "popitem",
    "remove",
    "clear",
    "update",
    "setdefault",
    "add",
    "discard",
    "sort",
    "reverse",
}


def _module(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _owns(module: str, part: type) -> bool:
    return module == part.OWNER or module.startswith(part.OWNER + ".")


class _Writes(ast.NodeVisitor):
    """Writes to parts' fields in one module: (line, part, field, how)."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str, str, str]] = []
        self.aliases: list[dict[str, str]] = [{}]  # per function: a name bound to a part (`p = sess.runs`)

    def _part(self, expr) -> str | None:
        if isinstance(expr, ast.Attribute) and expr.attr in session.PARTS:
            return expr.attr
        if isinstance(expr, ast.Name):
            return self.aliases[-1].get(expr.id)
        return None

    def _field(self, expr, how: str, line: int) -> None:
        """``expr`` (an Attribute) is written: count it when it is a field of a part."""
        if isinstance(expr, ast.Attribute):
            part = self._part(expr.value)
            if part is not None and expr.attr in session.PARTS[part].__slots__:
                self.found.append((line, part, expr.attr, how))

    def _target(self, target, how: str) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self._target(t, how)
        elif isinstance(target, ast.Starred):
            self._target(target.value, how)
        elif isinstance(target, ast.Attribute):
            self._field(target, how, target.lineno)
        elif isinstance(target, ast.Subscript):
            self._field(target.value, how + " of an item", target.lineno)

    def _scope(self, node) -> None:
        self.aliases.append(dict(self.aliases[-1]))
        self.generic_visit(node)
        self.aliases.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _scope

    def _bind(self, targets, value) -> None:
        for target in targets:
            pairs = (
                zip(target.elts, value.elts)
                if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                else [(target, value)]
            )
            for t, v in pairs:
                if isinstance(t, ast.Name):
                    part = self._part(v)
                    if part is not None:
                        self.aliases[-1][t.id] = part
                    else:
                        self.aliases[-1].pop(t.id, None)

    def visit_Assign(self, node) -> None:
        for t in node.targets:
            self._target(t, "assignment")
        self._bind(node.targets, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node) -> None:
        self._target(node.target, "assignment")
        if node.value is not None:
            self._bind([node.target], node.value)
        self.generic_visit(node)

    def visit_AugAssign(self, node) -> None:
        self._target(node.target, "augmented assignment")
        self.generic_visit(node)

    def visit_Delete(self, node) -> None:
        for t in node.targets:
            self._target(t, "del")
        self.generic_visit(node)

    def visit_Call(self, node) -> None:
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in MUTATORS:
            self._field(f.value, f".{f.attr}()", node.lineno)
        if isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and node.args:
            part = self._part(node.args[0])
            if part is not None:
                name = node.args[1] if len(node.args) > 1 else None
                field = name.value if isinstance(name, ast.Constant) else "?"
                if field == "?" or field in session.PARTS[part].__slots__:
                    self.found.append((node.lineno, part, field, f.id))
        self.generic_visit(node)


def writes_from_elsewhere(root: pathlib.Path = ROOT / "workbench") -> list[str]:
    out = []
    for path in sorted(root.rglob("*.py")):
        module = _module(path)
        visitor = _Writes()
        visitor.visit(ast.parse(path.read_text(), str(path)))
        for line, part, field, how in visitor.found:
            owner = session.PARTS[part]
            if not _owns(module, owner):
                out.append(f"{path.relative_to(ROOT)}:{line}: {how} to session.{part}.{field} (owned by {owner.OWNER})")
    return out


def test_no_module_writes_a_part_it_does_not_own():
    assert writes_from_elsewhere() == []


def test_the_count_sees_each_kind_of_write(tmp_path):
    pkg = tmp_path / "workbench" / "notebook"
    pkg.mkdir(parents=True)
    (pkg / "elsewhere.py").write_text(
        "def f(sess, other):\n"
        "    sess.runs.started = None\n"  # 2
        "    sess.stream.collector, x = None, 1\n"  # 3
        "    sess.runs.hangs.append({})\n"  # 4
        "    sess.checkpoints.autosave['every'] = 3\n"  # 5
        "    part = sess.ranks\n"
        "    part.rankset = other\n"  # 7
        "    setattr(sess.setup, 'recipe', {})\n"  # 8
        "    del sess.trackers.by_kind['mlflow']\n"  # 9
        "    sess.runs.marks.get('run')\n"  # a read
        "    other.rankset = None\n"  # not a part
    )
    global ROOT
    kept, ROOT = ROOT, tmp_path
    try:
        found = writes_from_elsewhere(tmp_path / "workbench")
    finally:
        ROOT = kept
    assert [int(line.split(":")[1]) for line in found] == [2, 3, 4, 5, 7, 8, 9], found


def test_a_part_cannot_be_replaced_nor_a_field_made_up():
    sess = session.Session("x")
    with pytest.raises(AttributeError):
        sess.runs = None
    with pytest.raises(AttributeError):
        sess.supervisor = None  # a field of the bag the session once was
    with pytest.raises(AttributeError):
        sess.runs.watchdog = None
    assert sess.checkpoints.own_folder is False and session.KERNEL.add("named_one").checkpoints.own_folder
    session.KERNEL.forget(session.KERNEL.get("named_one"))
