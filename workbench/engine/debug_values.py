"""The values a stopped rank shows JupyterLab's debugger: variables, their children, and refs.

Each value is a Debug Adapter Protocol ``Variable`` (name, value as text, type, and a
``variablesReference`` when it has children to open). References live as long as the stop
they were made in; the notebook turns them into ids that cannot meet the kernel's own.
Texts are cut at :data:`TEXT_MAX` characters and children lists at :data:`CHILDREN_MAX`:
a value never costs more than a glance (a tensor's ``repr`` is torch's own summary).
"""

from __future__ import annotations

import re
import types

TEXT_MAX = 1000
CHILDREN_MAX = 300

# names a notebook namespace holds that are IPython's, not the user's (ipykernel hides the same)
_HIDDEN = {
    "__name__",
    "__doc__",
    "__package__",
    "__loader__",
    "__spec__",
    "__annotations__",
    "__builtins__",
    "__builtin__",
    "__display__",
    "__file__",
    "__cached__",
    "__session__",
    "get_ipython",
    "exit",
    "quit",
    "open",
    "In",
    "Out",
    "_oh",
    "_dh",
    "_ih",
    "_",
    "__",
    "___",
}
_HISTORY = re.compile(r"^(_\d+|_i\d*|_ii+|_i)$")
# what ipyparallel puts in the namespace while it applies a function (the cell's own request)
_APPLY = re.compile(r"^_[0-9a-f]{8}_[0-9a-f]{24}_\d+_\d+_(f|args|kwargs|result)$")


def shown(name: str) -> bool:
    """Whether a namespace entry is the user's (not IPython's history or plumbing)."""
    return name not in _HIDDEN and not _HISTORY.match(name) and not _APPLY.match(name)


def text(value) -> str:
    try:
        out = repr(value)
    except Exception as exc:  # a broken __repr__ must not break the panel
        out = f"<repr failed: {type(exc).__name__}: {exc}>"
    return out if len(out) <= TEXT_MAX else out[: TEXT_MAX - 1] + "…"


def _tensor_like(value) -> bool:
    module = type(value).__module__ or ""
    return module.split(".")[0] in ("torch", "numpy", "jax", "jaxlib") and hasattr(value, "shape")


class Refs:
    """The references of one stop: number -> (kind, object)."""

    def __init__(self) -> None:
        self._items: dict[int, tuple[str, object]] = {}

    def add(self, kind: str, obj) -> int:
        ref = len(self._items) + 1
        self._items[ref] = (kind, obj)
        return ref

    def get(self, ref: int) -> tuple[str, object]:
        if ref not in self._items:
            raise KeyError(f"no variable reference {ref} at this stop (the rank moved on)")
        return self._items[ref]


def expandable(value) -> bool:
    if isinstance(value, (str, bytes, bytearray, int, float, complex, bool, type(None))):
        return False
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        return len(value) > 0
    if isinstance(value, types.ModuleType) or _tensor_like(value):
        return True
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)):
        return False
    return bool(getattr(value, "__dict__", None))


def variable(name: str, value, refs: Refs) -> dict:
    """The protocol ``Variable`` of ``value`` shown as ``name``."""
    return {
        "name": name,
        "value": text(value),
        "type": type(value).__name__,
        "evaluateName": name if name.isidentifier() else None,
        "variablesReference": refs.add("value", value) if expandable(value) else 0,
    }


def scope_variables(namespace: dict, refs: Refs) -> list[dict]:
    names = sorted((n for n in namespace if shown(n)), key=lambda n: (n.startswith("_"), n))
    return [variable(n, namespace[n], refs) for n in names[:CHILDREN_MAX]]


def children(value) -> list[tuple[str, object]]:
    """(name, value) of what ``value`` holds, at most :data:`CHILDREN_MAX`."""
    if isinstance(value, dict):
        pairs = [(text(k), v) for k, v in list(value.items())[:CHILDREN_MAX]]
    elif isinstance(value, (list, tuple)):
        pairs = [(str(i), v) for i, v in enumerate(value[:CHILDREN_MAX])]
    elif isinstance(value, (set, frozenset)):
        pairs = [(str(i), v) for i, v in enumerate(list(value)[:CHILDREN_MAX])]
    elif _tensor_like(value):
        pairs = [(a, getattr(value, a)) for a in ("shape", "dtype", "device", "requires_grad") if hasattr(value, a)]
        size = getattr(value, "size", None)
        count = value.numel() if hasattr(value, "numel") else (size if isinstance(size, int) else None)
        if count is not None and count <= 64 and hasattr(value, "tolist"):
            try:
                pairs.append(("values", value.tolist()))
            except Exception:  # a tensor whose values cannot be read here (meta, another device)
                pass
    elif isinstance(value, types.ModuleType):
        pairs = []
        for name in dir(value):
            if name.startswith("_") or len(pairs) >= CHILDREN_MAX:
                continue
            try:
                pairs.append((name, getattr(value, name)))
            except Exception:
                continue
    else:
        attrs = getattr(value, "__dict__", None) or {}
        pairs = [(k, v) for k, v in list(attrs.items()) if not (k.startswith("__") and k.endswith("__"))]
        pairs = pairs[:CHILDREN_MAX]
    return pairs


def child_variables(kind: str, obj, refs: Refs) -> list[dict]:
    if kind == "scope":
        return scope_variables(obj, refs)
    return [variable(name, value, refs) for name, value in children(obj)]
