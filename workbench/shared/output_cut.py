"""How much of a cell's printed output reaches the notebook, and the line that says what was cut.

Every rank writes all it prints to its log file (``engine.rank_log``); of each stream it sends
the notebook a head and a tail, within a per-rank share of the cell's limit, and in between one
line with what it left out. The rank writes that line without its rank number, so that ranks
that printed alike still show once; the notebook adds how to see the rest
(:func:`render`). Pure: both sides import it.
"""

from __future__ import annotations

import re

DEFAULT_LIMIT = 1 << 20  # characters one cell shows in all (every rank, both streams)
FLOOR = 4096  # the least a rank's stream keeps, however many ranks share the limit
LIVE_KEY = "_workbench_output_cut"  # the data message a rank sends while it cuts (live display)
LIVE_EVERY_S = 0.5  # how often, at most

_MARK = re.compile(r"^… ([\d,]+) lines? \(([^)]*)\) cut here; the rank's log has every line$", re.M)
_CUT = re.compile(r"^(?:\[[^\]]*\] )?… ([\d,]+) lines? \(([^)]*)\) cut here", re.M)  # as sent or as shown


def per_stream(limit: int, n_ranks: int) -> int:
    """Characters one rank's stdout (or stderr) keeps: its head and its tail, half each."""
    return max(FLOOR, limit // (2 * max(1, n_ranks)))


def size_text(chars: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if chars >= scale:
            return f"{chars / scale:.1f} {unit}"
    return f"{chars} B"


def marker(lines: int, chars: int) -> str:
    """The line a rank sends where it cut (``lines``: newlines in what it left out)."""
    return f"… {lines:,} line{'' if lines == 1 else 's'} ({size_text(chars)}) cut here; the rank's log has every line\n"


def parse_limit(text: str) -> int | None:
    """``all`` -> None (keep everything); ``200k``, ``4M``, ``1048576`` -> characters."""
    value = str(text).strip().lower()
    if value == "all":
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]i?b?|b)?", value)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(
            f"--output {text!r}: give `all` (keep every line) or a size such as 200k or 4M "
            f"(the most one cell shows; default {size_text(DEFAULT_LIMIT)})"
        )
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get((m.group(2) or "b")[0], 1)
    return int(float(m.group(1)) * scale)


def cut_count(text: str) -> tuple[int, int]:
    """(lines, cut lines) in ``text`` (as a rank sent it or as the notebook shows it): what was left out."""
    lines = n = 0
    for m in _CUT.finditer(text):
        lines += int(m.group(1).replace(",", ""))
        n += 1
    return lines, n


def render(text: str, ranks_arg: str) -> str:
    """``text`` with each rank's cut line saying how to see the rest (``ranks_arg``: ``0-3``)."""
    if "cut here" not in text:
        return text
    return _MARK.sub(
        lambda m: (
            f"… {m.group(1)} lines ({m.group(2)}) cut here; every line is in the ranks' log files: "
            f"`%distrain logs --ranks {ranks_arg} --tail 200` (or `--grep PATTERN`; "
            "`%%distrain --output all` keeps all of a cell)"
        ),
        text,
    )
