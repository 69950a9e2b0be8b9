"""Edited files take effect on a rank as ``%autoreload`` makes them in one kernel.

A module this rank imported from a synced file that changed is reloaded with IPython's
``superreload``: its functions and classes are updated in place, so objects made before
the edit call the new code. What cannot be updated in place is named with the way out
(``%distrain restart``): a C extension (a process loads it once), a module whose new code
fails to run (the rank keeps the old), and a class whose ``__init__`` changed while
instances it built live on in the rank's namespace (they keep what the old one built).
"""

from __future__ import annotations

import importlib
import os
import sys

from ..shared import replies

EXTENSIONS = (".so", ".pyd", ".dylib")


def entered(trees: tuple[tuple[str, str], ...], cwd: str | None) -> None:
    """Import from the copies (``(notebook folder, copy here)``) instead of the notebook's
    folders, and run in ``cwd`` (the copy of the notebook's working folder)."""
    for folder, copy in trees:
        while folder in sys.path:
            sys.path.remove(folder)
        if copy not in sys.path:
            sys.path.insert(0, copy)
    if cwd:
        os.chdir(cwd)
    importlib.invalidate_caches()


def _forget_listings(changed: dict[str, set[str]]) -> None:
    """The import system's cached listings of the changed folders (a new file is then found)."""
    prefixes = tuple(changed)
    for path, finder in list(sys.path_importer_cache.items()):
        if finder is not None and isinstance(path, str) and path.startswith(prefixes):
            finder.invalidate_caches()


def _namespace(namespace):
    if namespace is not None:
        return namespace
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            return shell.user_ns
    except ImportError:
        pass
    import __main__

    return vars(__main__)


def _changed_modules(changed: dict[str, set[str]]) -> list[tuple[str, object, str]]:
    """(name, module, path in its copy) of each imported module whose file is among ``changed``."""
    out = []
    prefixes = tuple(tree + os.sep for tree in changed)
    for name, module in list(sys.modules.items()):
        f = getattr(module, "__file__", None)
        if not isinstance(f, str) or not f:
            continue
        full = f if f.startswith(prefixes) else os.path.abspath(f) if f[0] != os.sep else None
        if full is None or not full.startswith(prefixes):
            continue
        for tree, paths in changed.items():
            if full.startswith(tree + os.sep):
                rel = full[len(tree) + 1 :].replace(os.sep, "/")
                if rel in paths:
                    out.append((name, module, rel))
    return out


def _init_code(cls):
    init = cls.__dict__.get("__init__")
    code = getattr(init, "__code__", None)
    return None if code is None else (code.co_code, repr(code.co_consts), code.co_names)


def _instances(namespace: dict, classes: dict[type, str]) -> dict[str, list[str]]:
    """class name -> the namespace names holding an instance of it (or of a module inside it)."""
    found: dict[str, list[str]] = {}
    for var, value in list(namespace.items()):
        if var.startswith("_"):
            continue
        values = [value]
        modules = getattr(value, "modules", None)
        if callable(modules) and hasattr(value, "named_modules"):  # a torch module: its children too
            try:
                values += list(modules())
            except Exception:
                pass
        for v in values:
            cls = classes.get(type(v))
            if cls is not None and var not in found.setdefault(cls, []):
                found[cls].append(var)
    return found


def reload_changed(changed: dict[str, set[str]], namespace: dict | None = None) -> replies.Reloaded:
    """Reload the modules imported from ``changed`` (copy -> paths below it that changed)."""
    import socket

    _forget_listings(changed)
    reloaded, not_reloaded = [], []
    targets = _changed_modules(changed)
    if not targets:
        return replies.Reloaded(host=socket.gethostname())
    try:
        from IPython.extensions.autoreload import superreload
    except ImportError:  # a rank without IPython's extension: a plain reload
        superreload = None
    ns = _namespace(namespace)
    for name, module, rel in targets:
        if rel.endswith(EXTENSIONS):
            not_reloaded.append((name, "a C extension: a process loads it once"))
            continue
        classes = {
            obj: f"{name}.{obj.__name__}"
            for obj in vars(module).values()
            if isinstance(obj, type) and obj.__module__ == name
        }
        before = {cls: _init_code(cls) for cls in classes}
        try:
            if superreload is not None:
                superreload(module)
            else:
                importlib.reload(module)
        except BaseException as exc:  # noqa: BLE001 - the rank keeps what it ran, and says why
            not_reloaded.append((name, f"its new code failed ({type(exc).__name__}: {exc}); the ranks keep the old"))
            continue
        reloaded.append(name)
        new = vars(sys.modules.get(name, module))
        changed_init = {}  # the old class and the new (superreload moves old instances to the new)
        for cls, label in classes.items():
            now = new.get(cls.__name__)
            if isinstance(now, type) and _init_code(now) != before[cls]:
                changed_init[cls] = changed_init[now] = label
        if changed_init:
            for label, holders in _instances(ns, changed_init).items():
                not_reloaded.append(
                    (
                        label,
                        f"its __init__ changed; {', '.join(holders)} kept what the old one built "
                        "(build them again, or restart the ranks)",
                    )
                )
    return replies.Reloaded(host=socket.gethostname(), reloaded=tuple(reloaded), not_reloaded=tuple(not_reloaded))


def apply_edits(edits, here: str) -> replies.SyncEdited:
    """``rpc.SyncEdit``: the first rank of a synced host writes the folders' edits, the others find
    them written; ranks on ``here`` (the notebook's host) read the folders themselves. Then the
    modules this rank imported from the changed files are reloaded."""
    import socket

    from . import code_cache

    if socket.gethostname() == here:
        outcomes = tuple((e.key, "here") for e in edits)
        changed = {e.folder: {*e.paths, *e.deleted} for e in edits}
    else:
        outcomes = tuple((e.key, code_cache.apply_edit(e)) for e in edits)
        done = {k for k, outcome in outcomes if outcome != "out of step"}
        changed = {code_cache.tree_path(e.key): {*e.paths, *e.deleted} for e in edits if e.key in done}
    return replies.SyncEdited(host=socket.gethostname(), outcomes=outcomes, reloaded=reload_changed(changed))
