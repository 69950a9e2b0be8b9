"""Runs on a rank: notes who asks for a notebook-side module there, every time, not only the first.

ipyparallel loads a function sent to a rank back into its module, so the rank imports the test
module of every applied function, and with it whatever that test module imports (the notebook
side, plotly). Those imports are the tests' own; an import asked for by the workbench's rank code
is a breach of the process-role boundary, whether or not a test module had loaded that module
before (then the import is a ``sys.modules`` hit that no finder sees). So the watch looks at each
request: every ``import`` statement (``builtins.__import__``, resolved to absolute names, the
``from X import y`` submodules included), every ``importlib.import_module`` call, and, for what
comes another way, a finder at the head of ``sys.meta_path`` for first imports. Each looks at the
frame that asked and keeps the others in ``BREACHES``.
"""

from __future__ import annotations

import builtins
import importlib
import pathlib
import sys

GUARDED = ("workbench.notebook", "workbench.labserver", "plotly", "ipywidgets")
INTERNAL = GUARDED + ("_plotly_utils",)  # plotly's lazy attribute imports run from here
TESTS = str(pathlib.Path(__file__).resolve().parent) + "/"
BREACHES: list[tuple[str, str, str]] = []  # (module, importing module, file:line)
BEFORE: list[str] = []  # guarded modules the rank held when the watch began
_HOOKED: list = []  # the functions the watch replaced: (builtins.__import__, importlib.import_module)


def _within(name: str, packages: tuple[str, ...] = GUARDED) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def _origin(frame) -> tuple[str, str] | None:
    """The module and place that asked for the import; None where a test module asked."""
    while frame is not None:
        code = frame.f_code.co_filename
        module = frame.f_globals.get("__name__", "")
        if code.startswith("<frozen importlib") or "/importlib/" in code or code == __file__:
            frame = frame.f_back
            continue
        if _within(module, INTERNAL):  # one guarded module importing another: who asked for the first
            frame = frame.f_back
            continue
        if code.startswith(TESTS):
            return None
        return module, f"{code}:{frame.f_lineno}"
    return "?", "?"


def _note(names, frame) -> None:
    guarded = [n for n in names if _within(n)]
    if not guarded:
        return
    origin = _origin(frame)
    if origin is None:
        return
    for name in guarded:
        # tqdm.auto draws with ipywidgets in an ipykernel engine: the user's library's import
        if name.startswith("ipywidgets") and origin[0].startswith("tqdm"):
            continue
        breach = (name, *origin)
        if breach not in BREACHES:
            BREACHES.append(breach)


def _requested(name: str, globals_, fromlist, level: int) -> list[str]:
    """The absolute module names an ``import`` statement asks for (``from a import b``: ``a`` and ``a.b``,
    which may be a submodule)."""
    if level:
        package = (globals_ or {}).get("__package__") or (globals_ or {}).get("__name__", "")
        try:
            name = importlib.util.resolve_name("." * level + name, package)
        except (ImportError, ValueError):
            return []
    return [name, *(f"{name}.{f}" for f in fromlist or () if f != "*")]


def _watched_import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002 - __import__'s own names
    try:
        _note(_requested(name, globals, fromlist, level), sys._getframe(1))
    except Exception:  # the watch never breaks an import
        pass
    return _HOOKED[0](name, globals, locals, fromlist, level)


def _watched_import_module(name, package=None):
    try:
        _note([importlib.util.resolve_name(name, package) if name.startswith(".") else name], sys._getframe(1))
    except Exception:
        pass
    return _HOOKED[1](name, package)


class _Watch:
    def find_spec(self, name, path=None, target=None):
        if _within(name) and name not in sys.modules:
            _note([name], sys._getframe(1))
        return None  # the usual finders load it


def install() -> None:
    """Put the watch on every import request (once), before anything ran on the rank."""
    import importlib.util  # noqa: F401 - resolve_name, before the hook is in place

    if any(isinstance(f, _Watch) for f in sys.meta_path):
        return
    BEFORE.extend(sorted(m for m in sys.modules if _within(m)))
    _HOOKED[:] = [builtins.__import__, importlib.import_module]
    builtins.__import__ = _watched_import
    importlib.import_module = _watched_import_module
    sys.meta_path.insert(0, _Watch())


def report() -> tuple[bool, list[str], list[tuple[str, str, str]]]:
    """Whether the watch runs (on every request), what was there before it, and the breaches since."""
    watching = (
        any(isinstance(f, _Watch) for f in sys.meta_path)
        and builtins.__import__ is _watched_import
        and importlib.import_module is _watched_import_module
    )
    return watching, BEFORE, BREACHES
