"""Value checks for every ``%distrain`` parser (the sub-commands' and the planner's).

One implementation of each: argparse calls them as ``type=`` and, on a bad value, names
the flag beside the message (``argument --keep: expected a whole number >= 1, got '0'``).
Pure (argparse only), so the planner can use them without loading the rank machinery.
"""

from __future__ import annotations

import argparse
import re

__all__ = [
    "int_at_least",
    "positive_int",
    "non_negative_int",
    "positive_float",
    "non_negative_float",
    "seconds",
    "rank_selection",
    "session_names",
    "byte_size",
    "output_limit",
    "regex",
    "MODEL_SIZES",
]

# The teaching GPT's presets (workbench.engine.control.build_default), smallest first.
MODEL_SIZES = ("tiny", "small")

_RANKS = re.compile(r"^\s*(all|\d+(-\d+)?(\s*,\s*\d+(-\d+)?)*)\s*$", re.IGNORECASE)


def _whole(text: str) -> int:
    """``8``, and also ``8.0`` / ``1e3`` where they are whole (the planner's sizes come that way)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    return int(value)


def int_at_least(lo: int):
    """A ``type=`` that takes whole numbers >= ``lo``."""

    def check(text: str) -> int:
        value = _whole(text)
        if value < lo:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {lo}, got {text!r}")
        return value

    check.__name__ = f"int_at_least_{lo}"
    check.metavar = "N"
    return check


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or a positive number, got {text!r}")
    return value


def seconds(text: str) -> float:
    """A timeout or wait: positive seconds."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def rank_selection(text: str) -> str:
    """``all``, ``2``, ``0,2`` or ``1-3``: the form is checked here, the range by the rank set."""
    if not _RANKS.match(text):
        raise argparse.ArgumentTypeError(f"expected ranks like 'all', 2, 0,2 or 1-3, got {text!r}")
    return text.strip()


def session_names(text: str) -> tuple[str, ...]:
    """``ddp,fsdp``: session names, comma-separated; whether they exist is the kernel's to say."""
    names = tuple(n.strip() for n in text.split(","))
    if not text.strip() or not all(names):
        raise argparse.ArgumentTypeError(f"expected session names like ddp,fsdp, got {text!r}")
    return tuple(dict.fromkeys(names))


def byte_size(text: str) -> int:
    """A size in bytes written as people do: ``64M``, ``5G``, ``500k``."""
    from .code_tree import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def output_limit(text: str) -> int | None:
    """``all`` (None: every line) or the most characters a cell shows: ``200k``, ``4M``."""
    from .output_cut import parse_limit

    try:
        return parse_limit(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected `all` or a size such as 200k or 4M, got {text!r}") from None


def regex(text: str) -> str:
    """A Python regular expression, checked here (``--grep``)."""
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"not a regular expression ({exc}): {text!r}") from None
    return text


# what help and usage lines call a value of each kind (`--timeout S`, not `--timeout TIMEOUT`)
positive_float.metavar = "X"
non_negative_float.metavar = "X"
seconds.metavar = "S"
rank_selection.metavar = "RANKS"
byte_size.metavar = "SIZE"
output_limit.metavar = "SIZE"
regex.metavar = "PATTERN"
