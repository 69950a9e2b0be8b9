"""Keywords of an earlier Python API, refused with one line naming the new one (docs/grammar.md)."""

from __future__ import annotations


def refuse(call: str, given: dict, renamed: dict[str, str]) -> None:
    """Raise for the keywords in ``given`` (what a ``**earlier`` parameter caught): one of an earlier
    surface names its new form, any other is refused as Python refuses an unknown keyword."""
    for old in given:
        if old in renamed:
            raise TypeError(f"{call}({old}=...) is now {call}({renamed[old]}=...); nothing was done")
        raise TypeError(f"{call}() got an unexpected keyword argument {old!r}")
