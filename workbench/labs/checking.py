"""The check registry: ``@checker("lab_03.my_dim")`` registers, ``check(...)`` answers (notebook side).

A checker compares a student's answer with what the student's own run measured (values
pulled from the ranks or computed by the planner, passed as keyword arguments) and either
returns the text of a pass line or raises :class:`CheckFailed` with a hint that says what
is off. Checkers live one module per lab (``workbench/labs/lab_03.py``), imported on the
first check that names them. Never imports torch.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable

NAME = re.compile(r"^(?P<lab>[a-z][a-z0-9_]*)\.(?P<answer>[A-Za-z_][A-Za-z0-9_]*)$")

_checkers: dict[str, Callable[..., str]] = {}


class CheckFailed(AssertionError):
    """A student's answer disagrees with the measured value; the message is the hint."""


def checker(name: str):
    """Register ``fn(value, **measured) -> pass text`` under ``name`` (``"<lab>.<answer>"``).

    Two different functions may not share a name; re-importing the same function (a
    module reload) replaces it."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ValueError(f"checker name {name!r}: use '<lab module>.<answer>', e.g. 'lab_03.my_dim'")

    def register(fn: Callable[..., str]) -> Callable[..., str]:
        lab = name.split(".")[0]
        if fn.__module__ != f"workbench.labs.{lab}":  # the lab's own checkers first, so a clash is seen
            try:
                _import_lab(lab)
            except LookupError:
                pass
        old = _checkers.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(
                f"checker {name!r} is already registered by {old.__module__}.{old.__qualname__}; "
                f"pick another name for {fn.__module__}.{fn.__qualname__}"
            )
        _checkers[name] = fn
        return fn

    return register


def registered(lab: str | None = None) -> list[str]:
    """Names of the registered checkers (of one lab module, importing it, when ``lab`` is given)."""
    if lab is not None:
        _import_lab(lab)
        return sorted(n for n in _checkers if n.split(".")[0] == lab)
    return sorted(_checkers)


def _import_lab(lab: str) -> None:
    try:
        importlib.import_module(f"workbench.labs.{lab}")
    except ModuleNotFoundError as exc:
        if exc.name != f"workbench.labs.{lab}":
            raise
        raise LookupError(f"no checkers for {lab!r}: there is no module workbench/labs/{lab}.py") from None


def lookup(name: str) -> Callable[..., str]:
    m = NAME.match(name) if isinstance(name, str) else None
    if m is None:
        raise LookupError(f"check name {name!r}: use '<lab module>.<answer>', e.g. 'lab_03.my_dim'")
    if name not in _checkers:
        _import_lab(m["lab"])
    if name not in _checkers:
        known = ", ".join(registered(m["lab"])) or "none"
        raise LookupError(f"no checker {name!r}; {m['lab']} has: {known}")
    return _checkers[name]


def verdict(name: str, value, /, **measured) -> str:
    """The pass line for ``value`` (``"check passed: ..."``), or :class:`CheckFailed` with the hint."""
    fn = lookup(name)
    if value is Ellipsis:
        question = (inspect.getdoc(fn) or "").strip().splitlines()
        raise CheckFailed(f"{name}: no answer yet: replace the `...`" + (f" ({question[0]})" if question else ""))
    params = inspect.signature(fn)
    try:
        params.bind(value, **measured)
    except TypeError as exc:
        wanted = [p for p in list(params.parameters)[1:]]
        raise TypeError(
            f"check({name!r}, value, ...): {exc}; this check takes "
            f"{', '.join(f'{p}=...' for p in wanted) or 'no measured values'}"
        ) from None
    text = fn(value, **measured)
    return f"check passed: {text}"


def check(name: str, value, /, **measured) -> None:
    """Check a student's answer against the measured values and print the pass line;
    raises :class:`CheckFailed` with a specific hint when the answer is off."""
    print(verdict(name, value, **measured))
