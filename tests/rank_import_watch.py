"""Runs on a rank: notes who imports a notebook-side module there.

ipyparallel loads a function sent to a rank back into its module, so the rank imports the test
module of every applied function, and with it whatever that test module imports (the notebook
side, plotly). Those imports are the tests' own; an import made by the workbench's rank code is a
breach of the process-role boundary. A finder at the head of ``sys.meta_path`` looks at the frame
that asked for each guarded module and keeps the others in ``BREACHES``.
"""

from __future__ import annotations

import pathlib
import sys

GUARDED = ("workbench.notebook", "workbench.labserver", "plotly", "ipywidgets")
INTERNAL = GUARDED + ("_plotly_utils",)  # plotly's lazy attribute imports run from here
TESTS = str(pathlib.Path(__file__).resolve().parent) + "/"
BREACHES: list[tuple[str, str, str]] = []  # (module, importing module, file:line)
BEFORE: list[str] = []  # guarded modules the rank held when the watch began


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


class _Watch:
    def find_spec(self, name, path=None, target=None):
        if _within(name) and name not in sys.modules:
            origin = _origin(sys._getframe(1))
            # tqdm.auto draws with ipywidgets in an ipykernel engine: the user's library's import
            if origin is not None and not (name.startswith("ipywidgets") and origin[0].startswith("tqdm")):
                BREACHES.append((name, *origin))
        return None  # the usual finders load it


def install() -> None:
    """Put the watch first on ``sys.meta_path`` (once), before anything ran on the rank."""
    if not any(isinstance(f, _Watch) for f in sys.meta_path):
        BEFORE.extend(sorted(m for m in sys.modules if _within(m)))
        sys.meta_path.insert(0, _Watch())


def report() -> tuple[bool, list[str], list[tuple[str, str, str]]]:
    """Whether the watch runs, what was there before it, and the breaches since."""
    return any(isinstance(f, _Watch) for f in sys.meta_path), BEFORE, BREACHES
